"""Causal conv1d update with separate read and write blocks (docs/semantics.md §4, "Causal
conv1d update"); the reference is :func:`mamba_align.core.conv1d_ref.causal_conv1d_update_ref`.

One program per (row, channel tile), both on grid axis 0. A row of one token (a decode row,
``K <= 4``) loads its ``K - 1`` history rows and its token once, sums the taps and stores
the new window from registers (``_one_token``, kernels/conv1d_one_token.py; in a decode
batch of fewer than ``LATENCY_BELOW`` rows every program runs it, its stores masked off on
other rows; on a 2-byte DS pool of ``K - 1`` columns, four channels a lane as 8-byte words:
kernels/conv1d_ds_words.py). Any other row (``_tiled_rows``, in passes of ``PASS_D``
channels) first loads its new window (from its read block at its read offset and from
``x``), then computes ``y`` for its tokens in tiles of ``BLOCK_T`` tokens, and only then,
after a barrier, stores the window to the write block (which may be the read block). Both
sum in fp32 the ``K`` taps in order, then the conv bias: the same order whatever the path,
batch or tile, so a row's bits do not depend on them.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from ..core.conv1d_ref import ACTIVATIONS
from .bookkeeping import check_errors
from .copy import check_layout, pool_align
from .jit import same_binary_jit
from .plan import (FLAG_DTYPES, FLOAT_DTYPES, ArraySpec, LaunchPlan, Op, Output, Static, cdiv,
                   check_array, check_layer, check_pool, check_seqlens, dtype_bits, io_align,
                   next_pow2, pool_scalars)
from .conv1d_ds_words import _one_token_words
from .conv1d_one_token import _one_token
from .rows import (BAD_BLOCK, BAD_CU_SEQLENS, BAD_OFFSET, BAD_QUERY_LEN, aligned_base,
                   flag_row, range_fault)

MAX_BLOCK_T = 16  # tokens per tile at most
MAX_TILE_D = 256  # channels per program from SMALL_BATCH rows (see conv_tile)
DECODE_TILE_SD = 512  # ... in an SD decode batch with packed taps, 2-byte window
DECODE_TILE_DS_WORDS = 512  # ... in a decode batch whose DS windows move as words
#: channels per pass of the tiled path where the windows move as words: its 512-channel
#: DS pass held the program at 117 registers, the words alone take 34 (ptxas, sm_90)
TILED_PASS_DS_WORDS = 128
SMALL_BATCH = 16  # below it, half the channels per program (benchmarks/README.md)
#: below this many rows the program is laid out for latency: its tile count is a constant
#: (the program id splits without a runtime division), a row posts its fault after its
#: work and, in a decode batch (``UNBRANCHED``), a one-token row's loads have no branch
#: ahead of them, so ptxas issues them sooner; from this many rows on, the 512-channel
#: program would then hold 88-98 registers instead of 64 and was slower
#: (benchmarks/README.md, "The rows' first loads" and "The window ahead of the row's
#: checks")
LATENCY_BELOW = 64
NUM_WARPS = 4


@triton.jit
def _full_at(rp, x_ptr, off, t0, i, d, x_stride, num_tokens, has_hist, mask, dtype: tl.constexpr,
             K: tl.constexpr, WIDTH: tl.constexpr, DIM: tl.constexpr, X_ALIGN: tl.constexpr,
             LAYOUT_DS: tl.constexpr):
    """Rows ``i`` of ``full = history ++ x`` (``K - 1`` history rows of the window at
    ``rp``, then the row's tokens from ``t0``), ``[len(i), len(d)]`` in ``dtype``; the
    history is zero without a read block. Only rows of ``x`` inside ``[0, num_tokens)`` are
    read, so the window can be loaded before the row's ids are checked."""
    hist = (i >= 0) & (i < K - 1)  # i >= 0 always, unless a wild cu_seqlens wrapped
    pos = (off + i).to(tl.int32)  # (wraps only where the mask is off)
    if LAYOUT_DS:
        offs = d[None, :] * WIDTH + pos[:, None]
    else:
        offs = pos[:, None] * DIM + d[None, :]
    h = tl.load(rp + offs, mask=mask & hist[:, None] & has_hist, other=0)
    xr = t0 + i - (K - 1)
    x_rows = xr * x_stride
    if X_ALIGN > 1:  # (see rows.aligned_base: stated on the op that makes the product)
        x_rows = tl.multiple_of(x_rows, X_ALIGN)
    xv = tl.load(x_ptr + x_rows[:, None] + d[None, :],
                 mask=mask & (~hist & (xr >= 0) & (xr < num_tokens))[:, None], other=0)
    return tl.where(hist[:, None], h.to(dtype), xv.to(dtype))


@same_binary_jit
def conv1d_update_kernel(
    pool_in_ptr,  # aliased with pool_ptr: read and written through pool_ptr
    errors_in_ptr,
    x_ptr,  # [T_total, D]
    weight_ptr,  # [D, K]
    bias_ptr,  # [D]
    cu_seqlens_ptr,  # [N + 1]
    read_block_ptr,
    read_offset_ptr,
    write_block_ptr,
    is_spec_ptr,
    num_tiles,  # channel tiles per row
    num_tokens,  # T_total
    layer_offset,  # layer * layer_stride
    block_stride,
    num_blocks,
    x_stride,
    w_stride,
    y_ptr,  # [T_total, D]
    pool_ptr,
    errors_ptr,
    K: tl.constexpr,
    WIDTH: tl.constexpr,  # W
    DIM: tl.constexpr,  # D
    ALIGN: tl.constexpr,  # of the pool's layer and block strides, in elements
    X_ALIGN: tl.constexpr,  # of x's row stride
    W_PAD: tl.constexpr,
    TILE_D: tl.constexpr,
    PASS_D: tl.constexpr,  # channels per pass of the tiled path (a divisor of TILE_D)
    BLOCK_T: tl.constexpr,
    LAYOUT_DS: tl.constexpr,
    SILU: tl.constexpr,
    W_PACKED: tl.constexpr,  # weight: four 2-byte taps in rows of 4 (aligned 8-byte words)
    LATENCY: tl.constexpr,  # a small batch (LATENCY_BELOW)
    UNBRANCHED: tl.constexpr,  # a small decode batch, K <= 4 (see _one_token)
    DS_WORDS: tl.constexpr,  # a one-token row's window moves as words (conv1d_ds_words.py)
):
    pid = tl.program_id(0).to(tl.int64)
    if LATENCY:
        tiles: tl.constexpr = (DIM + TILE_D - 1) // TILE_D  # = num_tiles
        row = pid // tiles
        tile = pid % tiles
    else:
        row = pid // num_tiles
        tile = pid % num_tiles
    t0 = tl.load(cu_seqlens_ptr + row).to(tl.int64)
    t1 = tl.load(cu_seqlens_ptr + row + 1).to(tl.int64)
    rb = tl.load(read_block_ptr + row).to(tl.int64)
    off = tl.load(read_offset_ptr + row).to(tl.int64)
    wb = tl.load(write_block_ptr + row).to(tl.int64)
    spec = tl.load(is_spec_ptr + row) != 0
    n = t1 - t0
    fault = range_fault(t0, t1, num_tokens)
    fault |= tl.where((rb < -1) | (rb >= num_blocks) | (wb < -1) | (wb >= num_blocks),
                      BAD_BLOCK, 0)
    fault |= tl.where((rb >= 0) & ((off < 0) | (off > WIDTH - K + 1)), BAD_OFFSET, 0)
    fault |= tl.where(spec & (n > WIDTH - K + 2), BAD_QUERY_LEN, 0)
    if (tile == 0) & (not LATENCY):
        flag_row(errors_ptr, row, fault)
    rbase = aligned_base(layer_offset, rb, block_stride, ALIGN)
    # reads stay inside the read block whatever the ids: the window is loaded before the
    # row's checks are known (no round trip for them), and stored only if it is clean
    has_hist = (rb >= 0) & (rb < num_blocks) & (off >= 0) & (off <= WIDTH - K + 1)
    if K > 4:  # (compiled only where a one-token row can take its own path)
        _tiled_rows(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist, t0, n,
                    spec, num_tokens, layer_offset, block_stride, x_stride, w_stride, fault,
                    wb, tile, K, WIDTH, DIM, ALIGN, X_ALIGN, W_PAD, TILE_D, PASS_D,
                    BLOCK_T, LAYOUT_DS, SILU)
    elif UNBRANCHED:  # a one-token row's work in every program, then the other rows'
        _one_token_row(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist,
                       t0, num_tokens, x_stride, w_stride, fault, n == 1,
                       aligned_base(layer_offset, wb, block_stride, ALIGN), wb >= 0, tile, K,
                       WIDTH, DIM, X_ALIGN, TILE_D, LAYOUT_DS, SILU, W_PACKED, DS_WORDS,
                       UNBRANCHED)
        if n != 1:
            _tiled_rows(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist,
                        t0, n, spec, num_tokens, layer_offset, block_stride, x_stride,
                        w_stride, fault, wb, tile, K, WIDTH, DIM, ALIGN, X_ALIGN, W_PAD,
                        TILE_D, PASS_D, BLOCK_T, LAYOUT_DS, SILU)
    elif n == 1:  # one token (a decode row): each input loaded once
        _one_token_row(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist,
                       t0, num_tokens, x_stride, w_stride, fault, True,
                       aligned_base(layer_offset, wb, block_stride, ALIGN), wb >= 0, tile, K,
                       WIDTH, DIM, X_ALIGN, TILE_D, LAYOUT_DS, SILU, W_PACKED, DS_WORDS,
                       UNBRANCHED)
    else:
        _tiled_rows(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist, t0, n,
                    spec, num_tokens, layer_offset, block_stride, x_stride, w_stride, fault,
                    wb, tile, K, WIDTH, DIM, ALIGN, X_ALIGN, W_PAD, TILE_D, PASS_D,
                    BLOCK_T, LAYOUT_DS, SILU)
    if (tile == 0) & LATENCY:  # last: its atomics would hold the loads above back
        flag_row(errors_ptr, row, fault)


@triton.jit
def _one_token_row(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist, t0,
                   num_tokens, x_stride, w_stride, fault, one, wbase, writes, tile,
                   K: tl.constexpr, WIDTH: tl.constexpr, DIM: tl.constexpr,
                   X_ALIGN: tl.constexpr, TILE_D: tl.constexpr, LAYOUT_DS: tl.constexpr,
                   SILU: tl.constexpr, W_PACKED: tl.constexpr, DS_WORDS: tl.constexpr,
                   UNBRANCHED: tl.constexpr):
    """A one-token row's work on channel tile ``tile``: as words where ``DS_WORDS``."""
    first = (tile * TILE_D).to(tl.int32)
    if DS_WORDS:
        _one_token_words(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, has_hist, t0,
                         num_tokens, x_stride, fault, one, wbase, writes, first, TILE_D, DIM,
                         X_ALIGN, SILU, UNBRANCHED)
    else:
        _one_token(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist, t0,
                   num_tokens, x_stride, w_stride, fault, one, wbase, writes,
                   first + tl.arange(0, TILE_D), K, WIDTH, DIM, X_ALIGN, LAYOUT_DS, SILU,
                   W_PACKED, UNBRANCHED)


@triton.jit
def _tiled_rows(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist, t0, n,
                spec, num_tokens, layer_offset, block_stride, x_stride, w_stride, fault, wb,
                tile, K: tl.constexpr, WIDTH: tl.constexpr, DIM: tl.constexpr,
                ALIGN: tl.constexpr, X_ALIGN: tl.constexpr, W_PAD: tl.constexpr,
                TILE_D: tl.constexpr, PASS_D: tl.constexpr, BLOCK_T: tl.constexpr,
                LAYOUT_DS: tl.constexpr, SILU: tl.constexpr):
    """Any row, ``BLOCK_T`` tokens at a time, ``PASS_D`` of the tile's channels at a
    time: the window is loaded first, the outputs computed tile by tile, and the window
    stored after a barrier (it may be rewritten in place)."""
    tl.static_assert(TILE_D % PASS_D == 0)
    for j in tl.static_range(TILE_D // PASS_D):
        _tiled_pass(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist, t0,
                    n, spec, num_tokens, layer_offset, block_stride, x_stride, w_stride,
                    fault, wb, (tile * TILE_D + j * PASS_D).to(tl.int32)
                    + tl.arange(0, PASS_D), K, WIDTH, DIM, ALIGN, X_ALIGN, W_PAD, PASS_D,
                    BLOCK_T, LAYOUT_DS, SILU)


@triton.jit
def _tiled_pass(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist, t0, n,
                spec, num_tokens, layer_offset, block_stride, x_stride, w_stride, fault, wb,
                d, K: tl.constexpr, WIDTH: tl.constexpr, DIM: tl.constexpr,
                ALIGN: tl.constexpr, X_ALIGN: tl.constexpr, W_PAD: tl.constexpr,
                TILE_D: tl.constexpr, BLOCK_T: tl.constexpr, LAYOUT_DS: tl.constexpr,
                SILU: tl.constexpr):
    """:func:`_tiled_rows` on the channels ``d`` (``TILE_D`` of them: one pass)."""
    dmask = (d < DIM)[None, :]
    rp = pool_ptr + rbase
    # the new window: C_new[i] = full[n - c + 1 + i] for i < K - 2 + c (in the pool's dtype:
    # it is only stored)
    c = tl.where(spec, n, 1)
    i = tl.arange(0, W_PAD)
    keep = (i < K - 2 + c)[:, None] & dmask & (n > 0) & (wb >= 0)
    new = _full_at(rp, x_ptr, off, t0, n - c + 1 + i, d, x_stride, num_tokens, has_hist, keep,
                   pool_ptr.dtype.element_ty, K, WIDTH, DIM, X_ALIGN, LAYOUT_DS)
    y_rows = y_ptr + t0 * DIM
    if (fault != 0) & ((fault & BAD_CU_SEQLENS) == 0):  # a faulty row's y is 0
        for start in range(0, n, BLOCK_T):
            t = start + tl.arange(0, BLOCK_T)
            tl.store(y_rows + t[:, None].to(tl.int64) * DIM + d[None, :],
                     tl.zeros((BLOCK_T, TILE_D), y_ptr.dtype.element_ty),
                     mask=(t < n)[:, None] & dmask)
    if fault == 0:
        cb = tl.load(bias_ptr + d, mask=d < DIM, other=0).to(tl.float32)
        tt = tl.arange(0, BLOCK_T)
        for start in range(0, n, BLOCK_T):
            t = start + tt
            tmask = (t < n)[:, None] & dmask
            acc = tl.zeros((BLOCK_T, TILE_D), tl.float32)
            for k in tl.static_range(K):  # y[t] = sum_k w[:, k] * full[t + k], k in order
                wk = tl.load(weight_ptr + d.to(tl.int64) * w_stride + k, mask=d < DIM,
                             other=0).to(tl.float32)
                acc += wk[None, :] * _full_at(rp, x_ptr, off, t0, t + k, d, x_stride,
                                              num_tokens, has_hist, tmask, tl.float32, K,
                                              WIDTH, DIM, X_ALIGN, LAYOUT_DS)
            acc += cb[None, :]
            if SILU:
                acc = acc * tl.sigmoid(acc)
            tl.store(y_rows + t[:, None].to(tl.int64) * DIM + d[None, :],
                     acc.to(y_ptr.dtype.element_ty), mask=tmask)
        tl.debug_barrier()  # every load of the window before any store: wb may be rb
        wp = pool_ptr + aligned_base(layer_offset, wb, block_stride, ALIGN)
        if LAYOUT_DS:
            w_offs = d[None, :] * WIDTH + i[:, None]
        else:
            w_offs = i[:, None] * DIM + d[None, :]
        tl.store(wp + w_offs, new, mask=keep)


def conv_tile(dim: int, num_rows: int, num_tokens: int, layout: str = "SD",
              packed_taps: bool = False, words: bool = False) -> int:
    """Channels per program (``NUM_WARPS`` warps) from what the batch needs
    (benchmarks/README.md, "Conv tiles" and "Packed taps"): from :data:`SMALL_BATCH` rows
    on, :data:`MAX_TILE_D`, or :data:`DECODE_TILE_SD` for an SD decode batch (at most one
    token per row on average) whose taps load as packed words and whose window is 2-byte
    (``packed_taps``, the case measured: four channels a lane, 8-byte window accesses);
    half of ``MAX_TILE_D`` in a smaller batch (lower latency where the GPU is not full)
    and in a DS decode batch (a one-token row's window is three strided 2-byte reads and
    three writes per channel there, and more, shorter programs keep more of them in
    flight); :data:`DECODE_TILE_DS_WORDS` in a decode batch whose DS windows move as words
    (``words``, :func:`ds_words`: four channels a lane), at any batch (ahead of the
    small-batch rule: 128-512 channels measured within 0.04 µs at B = 1 and 16,
    benchmarks/README.md, "DS windows as words"). Every output is its own sum of
    the taps in order, so the tile changes no bits."""
    decode = num_tokens <= num_rows
    if words and decode:
        cap = DECODE_TILE_DS_WORDS
    elif num_rows < SMALL_BATCH or (decode and layout == "DS"):
        cap = max(16, MAX_TILE_D // 2)
    elif decode and packed_taps:
        cap = DECODE_TILE_SD
    else:
        cap = MAX_TILE_D
    return min(cap, next_pow2(max(dim, 16)))


def ds_words(layout: str, ksize: int, width: int, dim: int, packed_taps: bool,
             pool: ArraySpec, x: ArraySpec, x_align: int, align: int) -> bool:
    """Whether a one-token row's window moves as 8-byte words
    (kernels/conv1d_ds_words.py): a DS pool of ``K - 1 = 3`` columns of a 2-byte dtype,
    ``K = 4`` packed taps, four channels a word group (``dim % 4 == 0``), and blocks and
    rows of ``x`` on 8-byte boundaries (``align`` and ``x_align`` elements)."""
    return (layout == "DS" and ksize == 4 and width == 3 and packed_taps
            and dtype_bits(pool.dtype) == 16 and dim % 4 == 0 and align % 4 == 0
            and x_align * dtype_bits(x.dtype) % 64 == 0)


def token_tile(num_tokens: int, num_rows: int) -> int:
    """Tokens per tile: the mean row length, as a power of two, at most :data:`MAX_BLOCK_T`
    (1 in a decode batch). Each output is its own sum of the taps in order, so the tile
    changes no bits: a row gives the same ``y`` in any batch."""
    return min(MAX_BLOCK_T, next_pow2(max(1, cdiv(num_tokens, max(1, num_rows)))))


@functools.lru_cache(maxsize=256, typed=True)
def plan_conv1d_update(pool: ArraySpec, errors: ArraySpec, x: ArraySpec, weight: ArraySpec,
                       bias: ArraySpec, cu_seqlens: ArraySpec, read_block: ArraySpec,
                       read_offset: ArraySpec, write_block: ArraySpec, is_spec: ArraySpec, *,
                       layer: int, layout: str, activation: str) -> LaunchPlan:
    check_layout(layout)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if pool.ndim != 4:
        raise ValueError(f"pool must be [L, NB, W, D] (SD) or [L, NB, D, W] (DS), got "
                         f"{list(pool.shape)}")
    check_pool("pool", pool, pool.shape[2:])
    if pool.dtype not in FLOAT_DTYPES:
        raise TypeError(f"pool must have dtype {'/'.join(FLOAT_DTYPES)}, got {pool.dtype}")
    scal = pool_scalars(pool, layout)
    check_layer(layer, scal["num_layers"])
    width, dim = scal["width"], scal["dim"]
    if dim == 0:
        raise ValueError("the conv pool must have D >= 1 channels")
    if width * dim >= 2**31:
        raise ValueError(f"a conv block of W x D = {width} x {dim} elements is too large: the "
                         "kernel addresses a block with 32-bit offsets (fewer than 2^31)")
    check_errors(errors)
    if x.ndim == 2 and x.shape[1] != dim:  # (a pool of the other layout, likeliest)
        form = "[L, NB, W, D]" if layout == "SD" else "[L, NB, D, W]"
        raise ValueError(f"x must have shape [T, D] with D = {dim}, the channels of a "
                         f"{layout} pool {form} {list(pool.shape)}, got {list(x.shape)}")
    check_array("x", x, (None, dim), FLOAT_DTYPES)
    check_array("weight", weight, (dim, None), FLOAT_DTYPES)
    ksize = weight.shape[1]
    if not 2 <= ksize <= width + 1:
        raise ValueError(f"the conv kernel size (weight's last dimension, {ksize}) must be in "
                         f"[2, W + 1] for a window of W = {width} rows")
    check_array("bias", bias, (dim,), FLOAT_DTYPES)
    rows = check_seqlens(cu_seqlens)
    for name, a in (("read_block", read_block), ("read_offset", read_offset),
                    ("write_block", write_block)):
        check_array(name, a, (rows,))
    check_array("is_spec", is_spec, (rows,), FLAG_DTYPES)
    # four 2-byte taps a channel in rows of 4 (any row stride for one channel): one word
    packed = (ksize == 4 and dtype_bits(weight.dtype) == 16
              and (weight.strides[0] == 4 or dim == 1))
    x_align = io_align(x, x.strides[:1])
    words = ds_words(layout, ksize, width, dim, packed, pool, x, x_align,
                     pool_align(scal, layout))
    tile = conv_tile(dim, rows, x.shape[0], layout, packed and dtype_bits(pool.dtype) == 16,
                     words)
    tiles = cdiv(dim, tile)
    return LaunchPlan(
        kernel=conv1d_update_kernel,
        grid=(max(1, rows * tiles),),
        inputs=("pool", "errors", "x", "weight", "bias", "cu_seqlens", "read_block",
                "read_offset", "write_block", "is_spec"),
        scalars=(("num_tiles", tiles), ("num_tokens", x.shape[0]),
                 ("layer_offset", layer * scal["layer_stride"]),
                 ("block_stride", scal["block_stride"]), ("num_blocks", scal["num_blocks"]),
                 ("x_stride", x.strides[0]), ("w_stride", weight.strides[0])),
        outputs=("y", "pool", "errors"),
        out_specs={"y": Output(x.shape, x.dtype)},
        constexprs={"K": ksize, "WIDTH": width, "DIM": dim,
                    "ALIGN": pool_align(scal, layout), "X_ALIGN": x_align,
                    "W_PAD": next_pow2(width), "TILE_D": tile,
                    "PASS_D": min(tile, TILED_PASS_DS_WORDS) if words else tile,
                    "BLOCK_T": token_tile(x.shape[0], rows), "LAYOUT_DS": layout == "DS",
                    "SILU": activation == "silu",
                    "W_PACKED": packed, "LATENCY": rows < LATENCY_BELOW,
                    # in a spec batch the one-token work's loads would delay a longer row's
                    # (benchmarks/README.md, "The window ahead of the row's checks")
                    "UNBRANCHED": (ksize <= 4 and rows < LATENCY_BELOW
                                   and x.shape[0] <= rows),
                    "DS_WORDS": words},
        num_warps=NUM_WARPS,
        aliases={"pool": "pool", "errors": "errors"},
        skip=rows == 0,  # no tokens: still flag the rows' bad ids
    )


CONV1D_UPDATE = Op(
    name="conv1d_update",
    arrays=("pool", "errors", "x", "weight", "bias", "cu_seqlens", "read_block", "read_offset",
            "write_block", "is_spec"),
    statics=(Static("layer", int), Static("layout", str), Static("activation", str, "silu")),
    plan=plan_conv1d_update,
    mutates=("pool", "errors"),
    returns=("y",),
    skipped={"y": 0},
    doc="""The causal conv1d update of docs/semantics.md §4 over variable-length rows, for
    layer ``layer`` of a conv pool ``[L, NB, W, D]`` (``layout="SD"``) or ``[L, NB, D, W]``
    (``"DS"``; fp32/fp16/bf16, updated in place). ``x``: ``[T_total, D]``; ``weight``:
    ``[D, K]``; ``bias``: ``[D]`` (zeros for none); ``cu_seqlens``: int ``[N + 1]``; per row
    (int ``[N]``): ``read_block`` (-1: zero history) and ``read_offset`` (the resolve step's
    ``conv_read`` and ``conv_read_bias``), ``write_block`` (``conv_write``; -1: no write),
    ``is_spec`` (bool/int8/int32/int64, nonzero: every token is a candidate); ``int``:
    int32 or int64. ``activation``: ``"silu"`` or ``"none"``. Returns ``y`` ``[T_total, D]``
    in ``x``'s dtype; arithmetic in fp32.

    A row with a block outside ``[-1, NB)``, a read offset outside ``[0, W - K + 1]``, a
    spec row of more than ``W - K + 2`` tokens, or its own two ``cu_seqlens`` entries
    outside ``[0, T_total]`` or decreasing, is skipped: ``y = 0`` on its tokens (none
    written where its entries are bad), no window stored, its fault ORed into ``errors``
    (int32 ``[2]``, ``[bits, lowest faulty row]``, in place). Tokens outside every row are
    not written; tokens two rows share (possible only when a row is
    ``BAD_CU_SEQLENS``) are unspecified.""",
)
