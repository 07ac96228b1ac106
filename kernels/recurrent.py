"""What the recurrent kernels (the gated delta rule, Mamba2's selective state update) share:
one program per (row, head, tile of state rows) on grid axis 0, a row's tokens and blocks
(docs/semantics.md §4), its fault bits, the zeroing of a faulty row's outputs, the state's
head offset, the block each candidate goes to, the gates, and the chunked kernels' products
and decays.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .rows import BAD_BLOCK, BAD_CU_SEQLENS, BAD_QUERY_LEN, aligned_base, range_fault

STATES = ("float32", "bfloat16")  # the state pools' dtypes


@triton.jit
def head_program(HEADS: tl.constexpr, TILES: tl.constexpr):
    """This program's ``(row, head, tile)``. The counts are constants: the program id
    splits without runtime divisions (shifts for powers of two), which held the first
    loads back."""
    pid = tl.program_id(0).to(tl.int64)
    return pid // (HEADS * TILES), (pid // TILES) % HEADS, pid % TILES


@triton.jit
def head_offset(layer_offset, head, head_stride, block_stride, ALIGN: tl.constexpr):
    """``(offset of the state of head ``head`` in a layer's block 0, block stride)``, both
    stated multiples of ``ALIGN`` (see same_binary_jit: the plan, not the launcher, states
    the alignment)."""
    if ALIGN > 1:
        block_stride = tl.multiple_of(block_stride, ALIGN)
        offset = tl.multiple_of(layer_offset + head * tl.multiple_of(head_stride, ALIGN), ALIGN)
    else:
        offset = layer_offset + head * head_stride
    return offset, block_stride


@triton.jit
def recurrent_row(row, cu_seqlens_ptr, read_block_ptr, write_blocks_ptr, is_spec_ptr, wb_stride,
                  WIN: tl.constexpr, WIN_PAD: tl.constexpr):
    """A recurrence's row (docs/semantics.md §4): its tokens ``[t0, t1)`` and their count
    ``n``, its read block ``rb``, whether it is a spec row, and the write blocks it uses
    (``wb``, ``[WIN_PAD]`` int64 at window columns ``jw``: the first ``n`` on a spec row,
    the first otherwise; -1 elsewhere, so unused columns are never checked)."""
    t0 = tl.load(cu_seqlens_ptr + row).to(tl.int64)
    t1 = tl.load(cu_seqlens_ptr + row + 1).to(tl.int64)
    n = t1 - t0
    rb = tl.load(read_block_ptr + row).to(tl.int64)
    spec = tl.load(is_spec_ptr + row) != 0
    jw = tl.arange(0, WIN_PAD)
    wb = tl.load(write_blocks_ptr + row * wb_stride + jw, mask=jw < WIN, other=-1).to(tl.int64)
    wb = tl.where(jw < tl.where(spec, n, 1), wb, -1)  # the blocks the row writes
    return t0, t1, n, rb, spec, jw, wb


@triton.jit
def recurrent_fault(t0, t1, n, rb, wb, spec, num_tokens, num_blocks, WIN: tl.constexpr):
    """The fault bits of a recurrence's row (:func:`recurrent_row`): its own ``cu_seqlens``
    entries, a read or used write block outside ``[-1, NB)``, a spec row longer than its
    window of ``WIN`` write blocks."""
    fault = range_fault(t0, t1, num_tokens)
    bad_w = tl.max(((wb < -1) | (wb >= num_blocks)).to(tl.int32), axis=0) > 0
    fault |= tl.where((rb < -1) | (rb >= num_blocks) | bad_w, BAD_BLOCK, 0)
    fault |= tl.where(spec & (n > WIN), BAD_QUERY_LEN, 0)
    return fault


@triton.jit
def clear_faulty_row(out_ptr, t0, t1, token_stride, fault, mask, BLOCK: tl.constexpr):
    """A faulty row's outputs are zero: ``BLOCK`` elements at ``out_ptr + t * token_stride``
    for each of its tokens, unless its tokens are unknown (``BAD_CU_SEQLENS``)."""
    if (fault != 0) & ((fault & BAD_CU_SEQLENS) == 0):
        for t in range(t0, t1):
            tl.store(out_ptr + t * token_stride, tl.zeros((BLOCK,), out_ptr.dtype.element_ty),
                     mask=mask)


@triton.jit
def candidate_block(jw, wb, spec, j):
    """The write block of token ``j``'s state (:func:`recurrent_row`'s ``wb``): candidate
    ``j`` on a spec row, write block 0 otherwise (stored only after the last token)."""
    return tl.sum(tl.where(jw == tl.where(spec, j, 0), wb, 0), axis=0)


#: the chunked kernels' products (.gdn_chunked, .selective_state_chunked): three TF32
#: tensor-core products for each fp32 one, close to fp32's rounding (benchmarks/README.md,
#: "The chunked gated delta rule")
DOT_PRECISION = tl.constexpr("tf32x3")


@triton.jit
def _tf32_parts(x):
    """fp32 ``x`` as ``big + small``: ``big`` is ``x`` rounded to TF32 (its 13 low mantissa
    bits cleared after adding half their range: to nearest, ties away), ``small`` the
    exact rest. No inf care: an infinite ``x`` gives a NaN ``small``."""
    big = ((x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return big, x - big


@triton.jit
def chunk_dot(a, b):
    """``a @ b`` in fp32 at ``DOT_PRECISION``; TF32x3 written out: both operands split by
    :func:`_tf32_parts`, then three TF32 products, the small terms first (Triton's own
    TF32x3 guards every element against inf and NaN: about 30 % more instructions in the
    chunked kernels' loops, benchmarks/README.md)."""
    if DOT_PRECISION == "tf32x3":
        a_big, a_small = _tf32_parts(a)
        b_big, b_small = _tf32_parts(b)
        acc = tl.dot(a_small, b_big, input_precision="tf32")
        acc = tl.dot(a_big, b_small, acc, input_precision="tf32")
        return tl.dot(a_big, b_big, acc, input_precision="tf32")
    return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def chunk_decays(g, CHUNK: tl.constexpr):
    """A chunk's decays from its log decays ``g`` ``[CHUNK]`` (0 past the row):
    ``G_i = g_0 + ... + g_i`` ``[CHUNK]`` and ``exp(D[i, j])`` ``[CHUNK, CHUNK]`` for
    ``D[i, j] = g_(j+1) + ... + g_i`` (``j <= i``; 0 above the diagonal). Each is summed by
    itself: a difference of two running sums loses a small decay next to a large one, and
    ``-inf - -inf`` is a NaN."""
    r = tl.arange(0, CHUNK)
    G = tl.cumsum(g, axis=0)
    D = tl.cumsum(tl.where(r[:, None] > r[None, :], g[:, None], 0.0), axis=0)
    return G, tl.where(r[:, None] >= r[None, :], tl.exp(D), 0.0)


@triton.jit
def chunk_state(s, G, decay, j, a, b, CHUNK: tl.constexpr):
    """A chunked kernel's state after the chunk's token ``j``: ``exp(G_j) s`` plus
    ``sum_{i <= j} exp(D[j, i]) a_i b_i^T`` (``a`` ``[CHUNK, M]``, ``b`` ``[CHUNK, L]``,
    ``s`` ``[M, L]``; ``G``, ``decay`` as :func:`chunk_decays` gives them)."""
    r = tl.arange(0, CHUNK)
    G_j = tl.sum(tl.where(r == j, G, 0.0), axis=0)
    decay_j = tl.sum(tl.where(r[:, None] == j, decay, 0.0), axis=0)  # row j: exp(D[j, :])
    return tl.exp(G_j) * s + chunk_dot(tl.trans(a * decay_j[:, None]), b)


@triton.jit
def chunk_advance(s, G, decay, a, b, c, n, jw, wb, spec, pool_ptr, head, block_stride,
                  s_offs, smask, ALIGN: tl.constexpr, CHUNK: tl.constexpr):
    """A chunked kernel's state after its chunk of tokens ``c .. c + CHUNK - 1`` (of ``n``;
    :func:`chunk_state`'s operands), and on a spec row the state after each of them stored
    to its candidate's block (:func:`recurrent_row`'s ``jw``, ``wb``)."""
    if spec:
        for j in range(0, tl.minimum(CHUNK, n - c)):
            sj = chunk_state(s, G, decay, j, a, b, CHUNK)
            wj = candidate_block(jw, wb, spec, c + j)
            tl.store(pool_ptr + aligned_base(head, wj, block_stride, ALIGN) + s_offs,
                     sj.to(pool_ptr.dtype.element_ty), mask=smask & (wj >= 0))
    return chunk_state(s, G, decay, CHUNK - 1, a, b, CHUNK)


@triton.jit
def store_final_state(s, n, jw, wb, spec, pool_ptr, head, block_stride, s_offs, smask,
                      ALIGN: tl.constexpr):
    """A chunked kernel's row with tokens: its final state ``s`` to write block 0 when
    ``spec`` is false (a non-spec row, or a spec row in a launch with one write block a row,
    whose one token's state is the final one)."""
    if ~spec & (n > 0):
        w0 = candidate_block(jw, wb, spec, 0)
        tl.store(pool_ptr + aligned_base(head, w0, block_stride, ALIGN) + s_offs,
                 s.to(pool_ptr.dtype.element_ty), mask=smask & (w0 >= 0))


@triton.jit
def decay_gates(ga, gb, A, dt_bias, FUSED_GATES: tl.constexpr):
    """``(g, beta)`` in fp32 from a token's two gate inputs (any shape): given as they are,
    or, ``FUSED_GATES`` (Qwen3-Next), ``g = -A * softplus(a + dt_bias)`` and
    ``beta = sigmoid(b)`` with ``A = exp(A_log)``."""
    if FUSED_GATES:
        g = -A * softplus(ga.to(tl.float32) + dt_bias)
        beta = tl.sigmoid(gb.to(tl.float32))
    else:
        g = ga.to(tl.float32)
        beta = gb.to(tl.float32)
    return g, beta


@triton.jit
def softplus(x):
    """``log(1 + exp(x))``, and ``x`` itself above 20 (fp32). ``log(1 + e)`` is taken as
    ``log(u) * e / (u - 1)`` for ``u = 1 + e`` (``e`` where ``u`` rounds to 1): a plain
    ``log(u)`` keeps only ``u``'s rounding of ``e``, relative error 1e-4 at ``x = -7`` and
    0.2 at ``x = -14``, where gate biases are initialised; this keeps ``exp``'s."""
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    return tl.where(x > 20.0, x, tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0))))
