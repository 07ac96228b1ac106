"""A small Gated-DeltaNet language model (or its Mamba2 twin), defined once as data: its
configuration, its weights from a fixed seed (NumPy, so torch and JAX load the same
numbers), and a float64 NumPy reference of its forward pass. ``hybrid_torch.py`` and
``hybrid_jax.py`` run it on the library's kernels.

Each layer is shaped like Qwen3-Next's linear-attention block::

    h = rms_norm(x)
    [qkv | z] = h @ w_qkvz;  [b | a] = h @ w_ba
    qkv = silu(causal_conv1d(qkv))              # conv state: the "conv" pool
    o = gated_delta_rule(q, k, v; gates from a, b, A_log, dt_bias; q/k l2norm)
                                                # recurrent state: the "ssm" pool
    x = x + rms_norm_gated(o, z) @ w_o          # per value head
    x = x + (silu(rms_norm(x) @ w_gate) * (rms_norm(x) @ w_up)) @ w_down

then a final norm and the output head. With ``mixer="mamba2"`` the recurrence is Mamba2's
(the rest of the block unchanged)::

    [C B x | z] = h @ w_qkvz;  dt = h @ w_dt    # C, B: groups of the state size, x: heads
    C B x = silu(causal_conv1d(C B x))
    y = selective_state_update(x, dt, A, B, C, D, dt_bias; dt softplus)

Residuals and logits are fp32; the weights, the activations between kernels and the conv
state are in the model's dtype; the recurrent state is fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, Mapping, NamedTuple, Sequence, Tuple

import ml_dtypes
import numpy as np

from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec
from mamba_align.core.checks import positive_int
from mamba_align.core.config import DTYPES
from mamba_align.core.conv1d_ref import causal_conv1d_update_ref
from mamba_align.core.dense_ref import linear_ref, rms_norm_ref, silu_mul_ref
from mamba_align.core.gdn_ref import gated_delta_rule_ref
from mamba_align.core.selective_state_ref import selective_state_update_ref

MIXERS = ("gdn", "mamba2")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the model: ``heads`` qk heads of ``head_k``, ``value_heads`` of ``head_v``
    (a multiple of ``heads``), a causal conv of ``conv_kernel`` taps over the q/k/v
    channels, an MLP of ``mlp`` hidden units. ``mixer="mamba2"``: Mamba2's recurrence, with
    ``heads`` groups of ``C`` and ``B`` (in place of q and k; ``head_k`` the state size) and
    ``value_heads`` heads of ``x`` (in place of v; ``head_v`` the head dim)."""

    vocab: int = 64
    d_model: int = 32
    layers: int = 2
    heads: int = 2
    value_heads: int = 4
    head_k: int = 8
    head_v: int = 8
    conv_kernel: int = 4
    mlp: int = 64
    eps: float = 1e-6
    dtype: str = "float32"  # weights, activations between kernels, conv state
    mixer: str = "gdn"  # or "mamba2"

    def __post_init__(self):
        for name in ("vocab", "d_model", "layers", "heads", "value_heads", "head_k", "head_v",
                     "mlp"):
            positive_int(name, getattr(self, name))
        positive_int("conv_kernel", self.conv_kernel, 2)
        if self.value_heads % self.heads:
            raise ValueError(f"value_heads = {self.value_heads} must be a multiple of heads = "
                             f"{self.heads}")
        if (isinstance(self.eps, bool) or not isinstance(self.eps, (int, float))
                or not 0 < self.eps < float("inf")):
            raise ValueError(f"eps must be a finite float > 0, got {self.eps!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {MIXERS}, got {self.mixer!r}")

    def check_tokens(self, tokens: Sequence[int], what: str = "tokens") -> None:
        """Refuses a token id outside ``[0, vocab)`` (an embedding row would be read out of
        range, or a negative id would wrap to the last rows)."""
        ids = np.asarray(tokens).ravel()
        if ids.size and ids.dtype.kind not in "iu":
            raise ValueError(f"{what}: token ids must be integers, got {ids.dtype}")
        bad = ids[(ids < 0) | (ids >= self.vocab)]
        if bad.size:
            raise ValueError(f"{what}: token {int(bad[0])} is not an id in [0, {self.vocab})")

    @property
    def d_conv(self) -> int:
        """The conv's channels: q, k and v of every head (Mamba2: C, B and x)."""
        return 2 * self.heads * self.head_k + self.value_heads * self.head_v

    @property
    def d_value(self) -> int:
        return self.value_heads * self.head_v

    def cache_config(self, block_size: int, num_spec: int) -> CacheConfig:
        """The two states of every layer: the conv window (``DS`` layout, the model's
        dtype) and the recurrence's fp32 state, ``[HV, V, K]`` (Mamba2: ``[H, P, N]``)."""
        return CacheConfig(block_size, num_spec, self.layers, {
            "conv": ConvSpec(self.conv_kernel, self.d_conv, "DS", self.dtype),
            "ssm": TemporalSpec((self.value_heads, self.head_v, self.head_k), "float32")})


class Blocks(NamedTuple):
    """The state blocks one step's rows read and write (the fields of a runner's resolved
    blocks the model uses): int ``[N]``, ``temporal_write`` ``[N, 1 + S]``."""

    temporal_read: Any
    conv_read: Any
    conv_read_bias: Any
    temporal_write: Any
    conv_write: Any


#: runs in seconds in Triton's interpreter
TINY = ModelConfig()
#: a meaningful size for the GPU: Qwen3-Next's head shapes, fewer and narrower layers
GPU = ModelConfig(vocab=4096, d_model=1024, layers=4, heads=8, value_heads=16, head_k=128,
                  head_v=128, mlp=2816, dtype="bfloat16")
#: TINY with Mamba2's recurrence: 2 groups of B and C (state size 8), 4 heads of x (8 wide)
TINY_MAMBA2 = replace(TINY, mixer="mamba2")


def weight_specs(cfg: ModelConfig) -> Dict[str, Tuple[Tuple[int, ...], str]]:
    """Every weight the model reads, by name: its shape and dtype name (``A_log``,
    ``dt_bias`` and Mamba2's ``A`` and ``D`` fp32, the rest ``cfg.dtype``)."""
    specs = {"embed": ((cfg.vocab, cfg.d_model), cfg.dtype)}
    for i in range(cfg.layers):
        p = f"l{i}."
        specs.update({
            p + "norm1": ((cfg.d_model,), cfg.dtype),
            p + "w_qkvz": ((cfg.d_model, cfg.d_conv + cfg.d_value), cfg.dtype),
            **({p + "w_dt": ((cfg.d_model, cfg.value_heads), cfg.dtype)}
               if cfg.mixer == "mamba2" else
               {p + "w_ba": ((cfg.d_model, 2 * cfg.value_heads), cfg.dtype)}),
            p + "conv_w": ((cfg.d_conv, cfg.conv_kernel), cfg.dtype),
            p + "conv_b": ((cfg.d_conv,), cfg.dtype),
            **({p + "A": ((cfg.value_heads,), "float32"),
                p + "D": ((cfg.value_heads,), "float32")}
               if cfg.mixer == "mamba2" else {p + "A_log": ((cfg.value_heads,), "float32")}),
            p + "dt_bias": ((cfg.value_heads,), "float32"),
            p + "onorm": ((cfg.head_v,), cfg.dtype),
            p + "w_o": ((cfg.d_value, cfg.d_model), cfg.dtype),
            p + "norm2": ((cfg.d_model,), cfg.dtype),
            p + "w_gate": ((cfg.d_model, cfg.mlp), cfg.dtype),
            p + "w_up": ((cfg.d_model, cfg.mlp), cfg.dtype),
            p + "w_down": ((cfg.mlp, cfg.d_model), cfg.dtype)})
    specs["norm_f"] = ((cfg.d_model,), cfg.dtype)
    specs["lm_head"] = ((cfg.d_model, cfg.vocab), cfg.dtype)
    return specs


def check_weights(cfg: ModelConfig, w: Mapping[str, Any]) -> None:
    """Refuses weights the model cannot run as configured: a missing or unknown name, or
    an array (NumPy, torch or JAX) of another shape or dtype than :func:`weight_specs`
    gives (the kernels would otherwise run another dtype than the state pools', or fail
    deep inside a launch)."""
    specs = weight_specs(cfg)
    missing, unknown = sorted(set(specs) - set(w)), sorted(set(w) - set(specs))
    if missing or unknown:
        raise ValueError(f"weights do not match the config: missing {missing}, unknown "
                         f"{unknown}")
    for name, (shape, dtype) in specs.items():
        got_shape = tuple(w[name].shape)
        got_dtype = str(w[name].dtype).removeprefix("torch.")
        if got_shape != shape or got_dtype != dtype:
            raise ValueError(f"weight {name!r} is {got_dtype} {list(got_shape)}; the config "
                             f"needs {dtype} {list(shape)}")


def init_weights(cfg: ModelConfig, seed: int = 0) -> Dict[str, np.ndarray]:
    """The model's weights by name, from ``seed``: projections scaled by
    ``1 / sqrt(fan_in)``, norms near 1, gates in the ranges Qwen3-Next initialises them
    to (Mamba2's ``A`` in ``[-16, -1]``, ``D`` near 1). ``A_log``, ``A``, ``D`` and
    ``dt_bias`` are fp32, everything else in ``cfg.dtype``."""
    rng = np.random.default_rng(seed)
    draw = {  # by the weight's last name part; each from the shape weight_specs gives
        "embed": lambda shape: rng.normal(size=shape),
        "conv_w": lambda shape: rng.normal(size=shape) / np.sqrt(shape[1]),
        "conv_b": lambda shape: 0.1 * rng.normal(size=shape),
        "A_log": lambda shape: np.log(rng.uniform(1, 16, size=shape)),
        "A": lambda shape: -rng.uniform(1, 16, size=shape),
        "D": lambda shape: 1 + 0.1 * rng.normal(size=shape),
        "dt_bias": lambda shape: rng.uniform(-1, 1, size=shape),
    }
    norm = lambda shape: 1 + 0.1 * rng.normal(size=shape)  # noqa: E731
    proj = lambda shape: rng.normal(size=shape) / np.sqrt(shape[0])  # noqa: E731  (fan in)
    w = {}
    for name, (shape, dtype) in weight_specs(cfg).items():  # (its order is the draws')
        kind = name.rsplit(".", 1)[-1]
        make = draw.get(kind, norm if "norm" in kind else proj)
        w[name] = make(shape).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    return w


def shard(cfg: ModelConfig, w: Dict[str, np.ndarray], tp: int,
          rank: int) -> Tuple[ModelConfig, Dict[str, np.ndarray]]:
    """Rank ``rank`` of ``tp`` tensor-parallel ranks, split by heads as serving engines do:
    its ``heads / tp`` qk heads and ``value_heads / tp`` value heads (the conv channels of
    those q, k, v; their gates, ``A_log``, ``dt_bias`` and rows of ``w_o``; Mamba2: the
    groups' C and B, the heads' x, ``dt``, ``A``, ``D``) and ``mlp / tp``
    MLP units (columns of ``w_gate`` / ``w_up``, rows of ``w_down``); norms, embedding and
    output head whole. Returns the shard's config (its ``cache_config`` describes the
    rank's state pools) and weights. The outputs of ``w_o`` and ``w_down`` are partial
    sums: summed over the ranks (one all-reduce each per layer), they are the whole
    model's up to the order of that sum."""
    check_weights(cfg, w)
    if tp < 1 or cfg.heads % tp or cfg.value_heads % tp or cfg.mlp % tp:
        raise ValueError(f"tp = {tp} must divide heads {cfg.heads}, value heads "
                         f"{cfg.value_heads} and mlp {cfg.mlp}")
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} must be in [0, tp = {tp})")
    H, HV, K, V = cfg.heads, cfg.value_heads, cfg.head_k, cfg.head_v
    qk = np.arange(rank * H // tp * K, (rank + 1) * H // tp * K)
    heads = np.arange(rank * HV // tp, (rank + 1) * HV // tp)
    vals = np.arange(rank * HV // tp * V, (rank + 1) * HV // tp * V)
    conv = np.concatenate([qk, H * K + qk, 2 * H * K + vals])  # this rank's q, k, v channels
    mlp = np.arange(rank * cfg.mlp // tp, (rank + 1) * cfg.mlp // tp)
    out = {n: a for n, a in w.items()}
    for i in range(cfg.layers):
        p = f"l{i}."
        out[p + "w_qkvz"] = w[p + "w_qkvz"][:, np.concatenate([conv, cfg.d_conv + vals])]
        if cfg.mixer == "mamba2":
            out[p + "w_dt"] = w[p + "w_dt"][:, heads]
            out[p + "A"], out[p + "D"] = w[p + "A"][heads], w[p + "D"][heads]
        else:
            out[p + "w_ba"] = w[p + "w_ba"][:, np.concatenate([heads, HV + heads])]
            out[p + "A_log"] = w[p + "A_log"][heads]
        out[p + "conv_w"], out[p + "conv_b"] = w[p + "conv_w"][conv], w[p + "conv_b"][conv]
        out[p + "dt_bias"] = w[p + "dt_bias"][heads]
        out[p + "w_o"] = w[p + "w_o"][vals]
        out[p + "w_gate"], out[p + "w_up"] = w[p + "w_gate"][:, mlp], w[p + "w_up"][:, mlp]
        out[p + "w_down"] = w[p + "w_down"][mlp]
    part = replace(cfg, heads=H // tp, value_heads=HV // tp, mlp=cfg.mlp // tp)
    out = {n: np.ascontiguousarray(a) for n, a in out.items()}
    check_weights(part, out)
    return part, out


def reference_logits(cfg: ModelConfig, w: Dict[str, np.ndarray],
                     tokens: Sequence[int]) -> np.ndarray:
    """float64 ``[T, vocab]``: the logits of one sequence from an empty state, every
    operation in float64 (the library's core references)."""
    check_weights(cfg, w)
    cfg.check_tokens(tokens)
    T = len(tokens)
    H, HV, K, V = cfg.heads, cfg.value_heads, cfg.head_k, cfg.head_v
    x = w["embed"][np.asarray(tokens)].astype(np.float64)
    cu, none, zero, first = [0, T], [-1], [0], [0]
    for i in range(cfg.layers):
        p = f"l{i}."
        h = rms_norm_ref(x, w[p + "norm1"], cfg.eps)
        proj = linear_ref(h, w[p + "w_qkvz"])
        mixed, z = proj[:, :cfg.d_conv], proj[:, cfg.d_conv:]
        conv_pool = np.zeros((1, cfg.d_conv, cfg.conv_kernel - 1))
        y, _, _ = causal_conv1d_update_ref(mixed, w[p + "conv_w"], w[p + "conv_b"], conv_pool,
                                           cu, none, zero, first, [False], layout="DS")
        q = y[:, :H * K].reshape(T, H, K)
        k = y[:, H * K:2 * H * K].reshape(T, H, K)
        v = y[:, 2 * H * K:].reshape(T, HV, V)
        pool = np.zeros((1, HV, V, K))
        if cfg.mixer == "mamba2":  # q, k, v are C, B, x
            o, _, _ = selective_state_update_ref(
                v, linear_ref(h, w[p + "w_dt"]), w[p + "A"], k, q, w[p + "D"],
                w[p + "dt_bias"], pool, cu, none, [first], [False])
        else:
            ba = linear_ref(h, w[p + "w_ba"])
            o, _, _ = gated_delta_rule_ref(q, k, v, pool, cu, none, [first], [False],
                                           A_log=w[p + "A_log"], a=ba[:, HV:],
                                           dt_bias=w[p + "dt_bias"], b=ba[:, :HV],
                                           use_qk_l2norm=True)
        o = rms_norm_ref(o.reshape(T * HV, V), w[p + "onorm"], cfg.eps,
                         z=z.reshape(T * HV, V)).reshape(T, HV * V)
        x = x + linear_ref(o, w[p + "w_o"])
        h2 = rms_norm_ref(x, w[p + "norm2"], cfg.eps)
        x = x + linear_ref(silu_mul_ref(linear_ref(h2, w[p + "w_gate"]),
                                        linear_ref(h2, w[p + "w_up"])), w[p + "w_down"])
    return linear_ref(rms_norm_ref(x, w["norm_f"], cfg.eps), w["lm_head"])
