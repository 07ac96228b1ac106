"""The gated delta rule's two operations (given gates, in-kernel gates) with separate read
and write blocks (docs/semantics.md §4, "Gated delta rule"): their checks and plans; the
reference is :func:`mamba_align.core.gdn_ref.gated_delta_rule_ref`.

``algorithm="recurrent"`` launches :mod:`.gdn_recurrent`'s token-by-token kernel (one
program per row, value head and tile of ``BV`` value rows, under ``REGISTER_CAP``).
``algorithm="chunked"`` launches :mod:`.gdn_chunked`'s two kernels instead, planned there
(:func:`.gdn_chunked.plan_chunked`) after this module's checks (a row's tokens by chunks,
as matrix products: every chunk's triangular solve at once, then the same grid as here
walking the chunks); they carry no register cap.
"""

from __future__ import annotations

import functools

from . import gdn_chunked as chunked
from .bookkeeping import check_errors
# (REGISTER_CAP: read here by tests and benchmarks)
from .gdn_recurrent import REGISTER_CAP  # noqa: F401
from .gdn_recurrent import gated_delta_rule_fused_gates_kernel, gated_delta_rule_kernel
from .plan import (FLAG_DTYPES, FLOAT_DTYPES, ArraySpec, LaunchPlan, Op, Output, Static, cdiv,
                   check_array, check_layer, check_pool, check_seqlens, fp32_value, io_align,
                   largest_align, next_pow2, pool_scalars)
from .recurrent import STATES

LAYOUTS = ("VK", "KV")
#: token by token (decode, spec) or by chunks of tokens (prefill: .gdn_chunked)
ALGORITHMS = ("recurrent", "chunked")
BV = 8  # value rows per program (fixed: batch invariance; benchmarks/README.md)
NUM_WARPS = 1
#: below this many rows the state is loaded and stored with streaming cache hints, which
#: help a small batch and cost a large one (benchmarks/README.md, "Streaming hints"); a
#: hint changes no arithmetic, so a row's bits do not depend on the batch
STREAM_BELOW = 16
#: below this many rows the first token's inputs load after the row's checks, so that the
#: state's loads issue first, which helps one row and costs four (benchmarks/README.md,
#: "The state ahead of the first token's inputs"); no arithmetic changes
STATE_FIRST_BELOW = 2


def _plan_gdn(pool, errors, q, k, v, gate_a, gate_b, A_log, dt_bias, cu_seqlens, read_block,
              write_blocks, is_spec, *, layer, scale, use_qk_l2norm, layout, algorithm, fused):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    check_array("q", q, (None, None, None), FLOAT_DTYPES)
    check_array("k", k, (None, None, None), FLOAT_DTYPES)
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"q and k must have the same shape [T, H, K], got q {list(q.shape)} "
                         f"and k {list(k.shape)}")
    T, H, K = q.shape
    check_array("v", v, (T, None, None), FLOAT_DTYPES)
    HV, V = v.shape[1], v.shape[2]
    if H == 0 or HV == 0 or HV % H:
        raise ValueError(f"value heads HV={HV} must be a positive multiple of qk heads H={H}")
    if K == 0 or V == 0:
        raise ValueError(f"head sizes must be >= 1, got K={K}, V={V}")
    if any(a != b for a, b, n in zip(q.strides, k.strides, q.shape) if n > 1):
        # (the kernel reaches k through q's strides; those of unit dims are never used)
        raise ValueError(f"k must have q's strides {list(q.strides)}, got {list(k.strides)}")
    state = (HV, K, V) if layout == "KV" else (HV, V, K)
    check_pool("pool", pool, state)
    if pool.dtype not in STATES:
        raise TypeError(f"pool must have dtype {'/'.join(STATES)}, got {pool.dtype}")
    scal = pool_scalars(pool)
    check_layer(layer, scal["num_layers"])
    check_errors(errors)
    names = ("a", "b") if fused else ("g", "beta")
    check_array(names[0], gate_a, (T, HV), FLOAT_DTYPES)
    check_array(names[1], gate_b, (T, HV), FLOAT_DTYPES)
    if T > 1 and gate_a.strides[0] != gate_b.strides[0]:
        raise ValueError(f"{names[0]} and {names[1]} must have the same row stride")
    if fused:
        check_array("A_log", A_log, (HV,), FLOAT_DTYPES)
        check_array("dt_bias", dt_bias, (HV,), FLOAT_DTYPES)
    rows = check_seqlens(cu_seqlens)
    check_array("read_block", read_block, (rows,))
    check_array("write_blocks", write_blocks, (rows, None))
    check_array("is_spec", is_spec, (rows,), FLAG_DTYPES)
    win = write_blocks.shape[1]
    if win < 1:
        raise ValueError("write_blocks must have 1 + num_spec >= 1 columns")
    if (isinstance(scale, bool) or not isinstance(scale, (int, float))
            or not 0 <= fp32_value(scale) < float("inf")
            or (scale > 0 and fp32_value(scale) == 0)):
        raise ValueError(f"scale must be a float >= 0 that fp32 holds (0: K^-1/2), got "
                         f"{scale!r}")
    # the state's alignment in elements, stated by the kernel (see same_binary_jit)
    align = largest_align((scal["layer_stride"], scal["block_stride"], pool.strides[2]), 16)
    pool_scal = (("wb_stride", write_blocks.strides[0]),
                 ("layer_offset", layer * scal["layer_stride"]),
                 ("block_stride", scal["block_stride"]), ("head_stride", pool.strides[2]),
                 ("num_blocks", scal["num_blocks"]))
    scale_scal = ("scale", float(scale) if scale > 0 else K ** -0.5)
    row_ids = ("cu_seqlens", "read_block", "write_blocks", "is_spec")
    common = {"K": K, "V": V, "WIN": win, "WIN_PAD": next_pow2(win),
              "LAYOUT_KV": layout == "KV", "L2NORM": bool(use_qk_l2norm), "ALIGN": align,
              "QK_ALIGN": io_align(q, q.strides[:2]), "HV": HV, "GROUP": HV // H}
    gates = ("a", "b", "A_log", "dt_bias") if fused else ("g", "beta")
    strides = (("qk_stride_t", q.strides[0]), ("qk_stride_h", q.strides[1]),
               ("v_stride_t", v.strides[0]), ("v_stride_h", v.strides[1]),
               ("gate_stride", gate_a.strides[0]))
    if algorithm == "chunked":
        return chunked.plan_chunked(q, v, rows, T, H, HV, K, V, strides, pool_scal, scale_scal,
                                    row_ids, gates, common, fused)
    bv = min(BV, next_pow2(V))
    return LaunchPlan(
        kernel=gated_delta_rule_fused_gates_kernel if fused else gated_delta_rule_kernel,
        grid=(max(1, rows * HV * cdiv(V, bv)),),
        inputs=("pool", "errors", "q", "k", "v") + gates + row_ids,
        scalars=(("num_tokens", T),) + strides + pool_scal + (scale_scal,),
        outputs=("o", "pool", "errors"),
        out_specs={"o": Output((T, HV, V), q.dtype)},
        constexprs=dict(common, BK=next_pow2(K), BV=bv, V_ALIGN=io_align(v, v.strides[:2]),
                        STREAM=rows < STREAM_BELOW, STATE_FIRST=rows < STATE_FIRST_BELOW),
        num_warps=NUM_WARPS,
        aliases={"pool": "pool", "errors": "errors"},
        skip=rows == 0,  # no tokens: still flag the rows' bad ids
    )


@functools.lru_cache(maxsize=256, typed=True)
def plan_gated_delta_rule(pool: ArraySpec, errors: ArraySpec, q: ArraySpec, k: ArraySpec,
                          v: ArraySpec, g: ArraySpec, beta: ArraySpec, cu_seqlens: ArraySpec,
                          read_block: ArraySpec, write_blocks: ArraySpec, is_spec: ArraySpec, *,
                          layer: int, scale: float, use_qk_l2norm: bool,
                          layout: str, algorithm: str = "recurrent") -> LaunchPlan:
    return _plan_gdn(pool, errors, q, k, v, g, beta, None, None, cu_seqlens, read_block,
                     write_blocks, is_spec, layer=layer, scale=scale,
                     use_qk_l2norm=use_qk_l2norm, layout=layout, algorithm=algorithm,
                     fused=False)


@functools.lru_cache(maxsize=256, typed=True)
def plan_gated_delta_rule_fused_gates(pool: ArraySpec, errors: ArraySpec, q: ArraySpec,
                                      k: ArraySpec, v: ArraySpec, a: ArraySpec, b: ArraySpec,
                                      A_log: ArraySpec, dt_bias: ArraySpec,
                                      cu_seqlens: ArraySpec, read_block: ArraySpec,
                                      write_blocks: ArraySpec, is_spec: ArraySpec, *,
                                      layer: int, scale: float, use_qk_l2norm: bool,
                                      layout: str, algorithm: str = "recurrent") -> LaunchPlan:
    return _plan_gdn(pool, errors, q, k, v, a, b, A_log, dt_bias, cu_seqlens, read_block,
                     write_blocks, is_spec, layer=layer, scale=scale,
                     use_qk_l2norm=use_qk_l2norm, layout=layout, algorithm=algorithm,
                     fused=True)


_STATICS = (Static("layer", int), Static("scale", float, 0.0),
            Static("use_qk_l2norm", bool, False), Static("layout", str, "VK"),
            Static("algorithm", str, "recurrent"))

_DOC = """The gated delta rule of docs/semantics.md §4 over variable-length rows, for layer
    ``layer`` of a state pool ``[L, NB, HV, V, K]`` (``layout="VK"``, K-last) or ``[L, NB,
    HV, K, V]`` (``"KV"``), fp32 or bf16, updated in place. ``q``, ``k``: ``[T_total, H,
    K]``, ``k`` with ``q``'s strides in torch (views of one fused tensor are fine); ``v``:
    ``[T_total, HV, V]`` (``HV % H == 0``);
    {gates}; all fp32/fp16/bf16.
    ``cu_seqlens``: int ``[N + 1]``; ``read_block`` int ``[N]`` (the resolve step's
    ``temporal_read``; -1: zero state); ``write_blocks`` int ``[N, 1 + S]``
    (``temporal_write``; -1: no write); ``is_spec`` bool/int8/int32/int64 ``[N]`` (nonzero:
    the state after token ``j + 1`` goes to write block ``j``; otherwise the final state to
    write block 0); ``int``: int32 or int64.
    ``scale``: 0 for ``K^-1/2``; ``use_qk_l2norm``: normalise q and k first. Returns ``o``
    ``[T_total, HV, V]`` in ``q``'s dtype; state arithmetic in fp32.
    ``algorithm``: ``"recurrent"`` (token by token: decode and spec rows) or ``"chunked"``
    ({chunk} tokens at a time as matrix products: the same results within rounding, not the
    same bits; a row's chunks start at its first token in the launch, so its bits depend
    on where its tokens were split into launches; for long prefill rows: two launches and
    ``T_total * HV * (3 K + V + {chunk} + 1)`` fp32 of scratch, faster than token by token
    on a few long rows: docs/status.md).

    A row with a block it uses outside ``[-1, NB)``, a spec row of more than ``1 + S``
    tokens, or its own two ``cu_seqlens`` entries outside ``[0, T_total]`` or decreasing is
    skipped: ``o = 0`` on its tokens (none written where its entries are bad), no state
    stored, its fault ORed into ``errors`` (int32 ``[2]``, in place). Tokens outside every
    row are not written; tokens two rows share (possible only when a row is
    ``BAD_CU_SEQLENS``) are unspecified, and with ``"chunked"`` so are all the outputs and
    the states of rows that share a token."""

GATED_DELTA_RULE = Op(
    name="gated_delta_rule",
    arrays=("pool", "errors", "q", "k", "v", "g", "beta", "cu_seqlens", "read_block",
            "write_blocks", "is_spec"),
    statics=_STATICS,
    plan=plan_gated_delta_rule,
    mutates=("pool", "errors"),
    returns=("o",),
    skipped={"o": 0},
    doc=_DOC.format(chunk=chunked.CHUNK,
                    gates="``g`` (log decay) and ``beta``: ``[T_total, HV]``, one row "
                          "stride in torch"),
)

GATED_DELTA_RULE_FUSED_GATES = Op(
    name="gated_delta_rule_fused_gates",
    arrays=("pool", "errors", "q", "k", "v", "a", "b", "A_log", "dt_bias", "cu_seqlens",
            "read_block", "write_blocks", "is_spec"),
    statics=_STATICS,
    plan=plan_gated_delta_rule_fused_gates,
    mutates=("pool", "errors"),
    returns=("o",),
    skipped={"o": 0},
    doc=_DOC.format(chunk=chunked.CHUNK,
                    gates="the gates computed in the kernel (Qwen3-Next) from ``a``, ``b`` "
                          "``[T_total, HV]`` (one row stride in torch) and ``A_log``, "
                          "``dt_bias`` ``[HV]``: ``g = -exp(A_log) * softplus(a + dt_bias)``, "
                          "``beta = sigmoid(b)``"),
)
