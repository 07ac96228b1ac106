"""Prefill by chunks, decode token by token: the gated delta rule's two algorithms on one
request, from torch and from JAX (docs/semantics.md §4).

A prompt of 100 tokens is prefilled in one launch with ``algorithm="chunked"`` (16 tokens
at a time as matrix products) into block 1 of a state pool; then 4 tokens are decoded one
launch each with the default ``algorithm="recurrent"``, each reading the block the last one
wrote. The same request run token by token throughout gives the same outputs within
rounding, not bit for bit. Splitting the prompt into two launches on a multiple of 16
tokens gives the one-launch bits; torch and JAX give the same bits.

Usage::

    python examples/chunked_prefill.py
"""

from __future__ import annotations

import numpy as np
import torch

from mamba_align.backends.torch import ops

DEV = "cuda" if torch.cuda.is_available() else "cpu"
H, HV, K, V = 2, 4, 32, 32  # qk heads, value heads, head sizes
PROMPT, DECODE = 100, 4


def tensor(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), device=DEV)


def inputs(seed: int = 0) -> dict:
    """q, k ``[T, H, K]``, v ``[T, HV, V]`` and the gates ``g``, ``beta`` ``[T, HV]`` for the
    prompt and the decoded tokens (float32)."""
    rng = np.random.default_rng(seed)
    T = PROMPT + DECODE
    return {"q": rng.normal(size=(T, H, K)), "k": rng.normal(size=(T, H, K)),
            "v": rng.normal(size=(T, HV, V)), "g": -rng.uniform(0, 0.5, (T, HV)),
            "beta": rng.uniform(0, 1, (T, HV))}


def launch(pool, x, t0, t1, read, write, algorithm) -> torch.Tensor:
    """Tokens ``[t0, t1)`` as one non-spec row from block ``read`` (-1: zero state) into
    block ``write`` of layer 0; returns their outputs ``[t1 - t0, HV, V]``."""
    errors = tensor(np.array([0, 2**31 - 1], np.int32))
    o = ops.gated_delta_rule_(pool, errors, *(tensor(x[n][t0:t1]).float()
                                              for n in ("q", "k", "v", "g", "beta")),
                              tensor([0, t1 - t0]), tensor([read]), tensor([[write]]),
                              tensor([0]), layer=0, use_qk_l2norm=True,
                              algorithm=algorithm)["o"]
    assert errors.tolist() == [0, 2**31 - 1], errors
    return o


def serve(x, prefill: str, cut: int = PROMPT) -> tuple:
    """The prompt prefilled with ``prefill`` (in two launches when ``cut < PROMPT``), then
    the decoded tokens token by token: ``(outputs [T, HV, V], the last state)``."""
    pool = torch.zeros(1, 8, HV, V, K, device=DEV)  # [L, NB, HV, V, K], block 0 unused
    outs = [launch(pool, x, 0, cut, -1, 1, prefill)]
    if cut < PROMPT:
        outs.append(launch(pool, x, cut, PROMPT, 1, 1, prefill))
    block = 1
    for t in range(PROMPT, PROMPT + DECODE):  # decode: each token reads the last state
        outs.append(launch(pool, x, t, t + 1, block, block + 1, "recurrent"))
        block += 1
    return torch.cat(outs).cpu().numpy(), pool[0, block].cpu().numpy()


def jax_prefill(x) -> np.ndarray:
    """The prompt prefilled by chunks from JAX: its outputs."""
    import jax.numpy as jnp

    from mamba_align.backends.jax import ops as jops
    from mamba_align.core import new_errors
    f32 = {n: jnp.asarray(x[n][:PROMPT], jnp.float32) for n in ("q", "k", "v", "g", "beta")}
    pool = jnp.zeros((1, 8, HV, V, K), jnp.float32)
    out = jops.gated_delta_rule(pool, jnp.asarray(new_errors()),
                                f32["q"], f32["k"], f32["v"], f32["g"], f32["beta"],
                                jnp.asarray([0, PROMPT]), jnp.asarray([-1]), jnp.asarray([[1]]),
                                jnp.asarray([0]), layer=0, use_qk_l2norm=True,
                                algorithm="chunked")
    return np.asarray(out["o"])


def main() -> None:
    x = inputs()
    chunked, s_chunked = serve(x, "chunked")
    recurrent, s_recurrent = serve(x, "recurrent")
    rel = lambda a, b: float(np.abs(a - b).max() / np.abs(b).max())  # noqa: E731
    print(f"chunked prefill vs token by token: outputs within {rel(chunked, recurrent):.1e}, "
          f"final state within {rel(s_chunked, s_recurrent):.1e} (relative)")
    split, _ = serve(x, "chunked", cut=64)
    print(f"prompt split at 64 (a multiple of 16) gives the one-launch bits: "
          f"{np.array_equal(split, chunked)}")
    print(f"torch and JAX give the same bits: {np.array_equal(jax_prefill(x), chunked[:PROMPT])}")


if __name__ == "__main__":
    main()
