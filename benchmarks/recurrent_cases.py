"""The cases ``bench_recurrent.py`` times: Qwen3-Next shapes, one batch of gated delta rule
rows and their conv update on state pools with distinct read and write blocks (cycled cold
through groups of blocks), their float64 references, the state bytes they move, and
flash-linear-attention's kernels, loaded and (for its conv) re-tuned per batch."""

from __future__ import annotations

import os

os.environ.setdefault("FLA_FLASH_QLA", "0")  # fla's own Triton kernels, not an add-on package
# no autotune results on disk: they are keyed without the batch, so a config tuned at one B
# would come back at every other (see retune_fla_conv)
os.environ.setdefault("FLA_CACHE_RESULTS", "0")

import math  # noqa: E402
from typing import Any, Callable, Dict, Optional  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mamba_align.backends.torch import ops as tops  # noqa: E402
from mamba_align.core.conv1d_ref import causal_conv1d_update_ref  # noqa: E402
from mamba_align.core.gdn_ref import gated_delta_rule_ref  # noqa: E402


def shapes(small: bool) -> Dict[str, Any]:
    if small:
        return dict(H=1, HV=2, K=16, V=16, D=32, KC=4, S=3, L=2, batches=(1, 2), prefill=8,
                    rotate=4 << 10)
    # rotate: state bytes read before a group of blocks comes round again (> the 50 MB L2)
    return dict(H=16, HV=32, K=128, V=128, D=8192, KC=4, S=3, L=2, batches=(1, 16, 64, 256),
                prefill=2048, rotate=256 << 20)


def load_fla():
    try:
        from fla.modules.causal_conv1d import causal_conv1d_update
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        return fused_recurrent_gated_delta_rule, chunk_gated_delta_rule, causal_conv1d_update
    except Exception as e:  # noqa: BLE001  (no fla, or no GPU for its kernels)
        print(f"fla unavailable: {e!r}")
        return None


def np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def check(name: str, got: torch.Tensor, want: np.ndarray, tol: float) -> None:
    err = np.max(np.abs(np32(got) - want)) / max(1e-6, np.max(np.abs(want)))
    if not err <= tol:
        raise SystemExit(f"{name}: relative error {err:.3g} > {tol} against the reference")



def block_groups(B: int, S: int, spec: bool, block_bytes: int, rotate: int,
                 gen: torch.Generator, dev: torch.device) -> tuple:
    """``(NB, groups)``: disjoint groups of blocks of a pool of ``NB`` blocks, enough that a
    group's state is read again only after ``rotate`` bytes of other state; each group
    ``(read [B], write [B, 1 + S], write[:, 0])``, the write blocks past the first -1 unless
    ``spec``."""
    nsets = max(1, math.ceil(rotate / (B * block_bytes)))
    per = B * (2 + S)
    nb = 2 + nsets * per
    ids = (torch.randperm(nb - 1, generator=gen)[: nsets * per] + 1).to(dev)
    groups = []
    for i in range(nsets):
        g = ids[i * per:(i + 1) * per]
        wbs = g[B:].view(B, 1 + S).clone()
        if not spec:
            wbs[:, 1:] = -1
        # every id array in storage of its own: a view that starts off a 16-byte boundary
        # (here g[:1] of an odd group) would be copied by the torch launcher first
        # (backends/torch/ops.py, _align_inputs), a kernel the timing would count
        groups.append((g[:B].clone(), wbs, wbs[:, 0].clone()))
    return nb, groups


def _of_group(groups: str, k: int) -> property:
    """Item ``k`` of the group of ``groups`` (a list of tuples of block ids) that the
    current call uses (the call count ``i``, cycled)."""
    return property(lambda self: getattr(self, groups)[self.i % len(getattr(self, groups))][k])


class Case:
    """One batch of GDN rows (and their conv), with distinct read and write blocks.

    Disjoint groups of blocks (enough that a group's state is read again only after
    ``s["rotate"]`` bytes of other state), which the timed functions cycle through (``turn``):
    replayed calls would otherwise find the state of small batches in the L2 cache. The
    conv pool has groups of its own (``crb``, ``cwb``), sized by its smaller blocks."""

    def __init__(self, s: Dict[str, Any], B: int, T: int, spec: bool, dev: torch.device,
                 gen: torch.Generator, conv_layout: str = "DS", conv_S: Optional[int] = None,
                 state: bool = True):
        """``conv_S``: the drafts the conv pool's windows hold room for (``W = KC - 1 +
        conv_S``; default ``s["S"]``); ``state=False``: no gated delta rule state pool (a
        conv-only case)."""
        self.B, self.T, self.spec, self.conv_layout = B, T, spec, conv_layout
        H, HV, K, V, D, KC, S, L = (s[n] for n in ("H", "HV", "K", "V", "D", "KC", "S", "L"))
        self.conv_S = S if conv_S is None else conv_S
        n = B * T
        self.nb, self.sets = block_groups(B, S, spec, HV * V * K * 4, s["rotate"], gen, dev)
        self.nsets = len(self.sets)
        conv_block = D * (KC - 1 + self.conv_S) * 2
        self.cnsets = max(1, math.ceil(s["rotate"] / (B * conv_block)))
        cnb = max(self.nb, 2 + self.cnsets * 2 * B)
        cids = (torch.randperm(cnb - 1, generator=gen)[: self.cnsets * 2 * B] + 1).to(dev)
        self.csets = [(cids[i * 2 * B:i * 2 * B + B].clone(),
                       cids[i * 2 * B + B:(i + 1) * 2 * B].clone())
                      for i in range(self.cnsets)]
        self.i = 0  # calls so far: group i % nsets of the state, i % cnsets of the conv
        self.cu = torch.arange(0, n + 1, T, device=dev)
        self.is_spec = torch.full((B,), int(spec), device=dev)
        bf = torch.bfloat16
        r = lambda *shape, dt=bf: torch.randn(*shape, generator=gen).to(dev, dt)  # noqa: E731
        self.q, self.k, self.v = r(n, H, K), r(n, H, K), r(n, HV, V)
        self.a, self.b = r(n, HV), r(n, HV)
        self.A_log, self.dt_bias = r(HV, dt=torch.float32) * 0.5, r(HV, dt=torch.float32)
        self.pool = torch.zeros((L, self.nb, HV, V, K), device=dev) if state else None
        self.x, self.w = r(n, D), r(D, KC)
        self.cb = torch.zeros(D, device=dev, dtype=bf)
        W = KC - 1 + self.conv_S
        block = (D, W) if conv_layout == "DS" else (W, D)
        self.cpool = torch.empty((L, cnb) + block, device=dev, dtype=bf)
        self.cpool.normal_(generator=torch.Generator(dev).manual_seed(int(
            torch.randint(1 << 30, (1,), generator=gen))))
        for rb, _, _ in self.sets if state else ():
            self.pool[:, rb] = r(L, B, HV, V, K, dt=torch.float32) * 0.1
        self.off = torch.zeros(B, dtype=torch.int64, device=dev)
        self.errors = torch.tensor([0, 2**31 - 1], dtype=torch.int32, device=dev)  # clear

    # the current call's blocks: read, write slots and the final write of the state group
    # i % nsets; read and write of the conv group i % cnsets
    rb, wbs, wb = (_of_group("sets", k) for k in range(3))
    crb, cwb = (_of_group("csets", k) for k in range(2))

    def turn(self) -> None:
        self.i += 1

    def use_sd_pool(self) -> None:
        """Hold the same conv windows in an "SD" pool (``[W, D]`` blocks) from now on."""
        if self.conv_layout != "SD":
            self.cpool, self.conv_layout = self.cpool.transpose(2, 3).contiguous(), "SD"
        self.i = 0

    def timed(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` on the next group of blocks at every call (also while captured)."""
        def call():
            self.turn()
            return fn()
        return call

    def assert_clean(self, what: str) -> None:
        if self.errors.tolist() != [0, 2**31 - 1]:
            raise SystemExit(f"{what}: the kernels flagged faults {self.errors.tolist()}")

    # -- ours ---------------------------------------------------------------------------
    def gdn(self):
        return tops.gated_delta_rule_fused_gates_(
            self.pool, self.errors, self.q, self.k, self.v, self.a, self.b, self.A_log,
            self.dt_bias, self.cu, self.rb, self.wbs, self.is_spec, layer=1,
            use_qk_l2norm=True)["o"]

    def conv(self):
        return tops.conv1d_update_(self.cpool, self.errors, self.x, self.w, self.cb, self.cu,
                                   self.crb, self.off, self.cwb, self.is_spec, layer=1,
                                   layout=self.conv_layout, activation="silu")["y"]

    def gdn_ref(self, row: int = 0):
        """o and the states written by ``row`` (float64 reference, one row)."""
        t0, t1 = row * self.T, (row + 1) * self.T
        block = np32(self.pool[1, self.rb[row]])[None]  # read block 0, write blocks 1..T
        pool = np.concatenate([block, np.zeros((self.T,) + block.shape[1:], np.float32)])
        o, out, _ = gated_delta_rule_ref(
            np32(self.q[t0:t1]), np32(self.k[t0:t1]), np32(self.v[t0:t1]), pool, [0, self.T], [0], [list(range(1, 1 + self.T)) if self.spec else [1]], [self.spec],
            A_log=np32(self.A_log), a=np32(self.a[t0:t1]), dt_bias=np32(self.dt_bias),
            b=np32(self.b[t0:t1]), use_qk_l2norm=True)
        return o, out[1:1 + (self.T if self.spec else 1)]

    def conv_ref(self, row: int = 0):
        t0, t1 = row * self.T, (row + 1) * self.T
        pool = np32(self.cpool[1, self.crb[row:row + 1]])
        y, _, _ = causal_conv1d_update_ref(np32(self.x[t0:t1]), np32(self.w), np32(self.cb),
                                           pool, [0, self.T], [0], [0], [-1], [self.spec],
                                           layout=self.conv_layout)
        return y


def state_bytes(s: Dict[str, Any], B: int, writes: int) -> int:
    return B * s["HV"] * s["V"] * s["K"] * 4 * (1 + writes)


def conv_bytes(s: Dict[str, Any], B: int, written_rows: int) -> int:
    return B * s["D"] * 2 * (s["KC"] - 1 + written_rows)


def fla_conv_calls(s: Dict[str, Any], c: Case, conv_update, label: str) -> tuple:
    """fla's conv update on the case's windows (its DS pool): re-tuned for this batch and
    checked against the reference, then ``(alone, pooled)`` to time with ``c.timed``:
    alone on contiguous ``[B, D, K]`` caches, one per conv group (as cold as ours); pooled
    as a pool user calls it (gather the history, kernel, scatter the new window)."""
    B, K, D, dev = c.B, s["KC"], s["D"], c.x.device
    retune_fla_conv()
    c.i = 0  # the conv group the check below reads
    caches = []
    for crb, _ in c.csets:
        cache = torch.zeros(B, D, K, device=dev, dtype=c.x.dtype)
        cache[:, :, 1:] = c.cpool[1, crb, :, :K - 1]
        caches.append(cache)
    y, _ = conv_update(x=c.x, cache=caches[0].clone(), weight=c.w, bias=None, activation="silu")
    check(f"fla conv {label} B={B}", y[:1], c.conv_ref(0), 2e-2)

    def alone():
        return conv_update(x=c.x, cache=caches[c.i % c.cnsets], weight=c.w, bias=None,
                           activation="silu")

    def pooled():
        cc = torch.zeros(B, D, K, device=dev, dtype=c.x.dtype)
        cc[:, :, 1:] = c.cpool[1, c.crb, :, :K - 1]
        conv_update(x=c.x, cache=cc, weight=c.w, bias=None, activation="silu")
        c.cpool[1, c.cwb, :, :K - 1] = cc[:, :, 1:]

    return alone, pooled


def retune_fla_conv() -> None:
    """Forget fla's autotuned conv config: its autotuner keys on (D, W) only, so the
    config chosen at the first batch size would serve every other (2.7x apart at B = 256
    between runs); cleared before each batch, every B gets fla's best."""
    import fla.modules.causal_conv1d.ops as conv_ops
    k = conv_ops.causal_conv1d_update_kernel
    while k is not None and not hasattr(k, "cache"):
        k = getattr(k, "fn", None)
    if k is not None and isinstance(k.cache, dict):
        k.cache.clear()
        k.cache_results = False  # (and none reloaded from disk)
