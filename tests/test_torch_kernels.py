"""The Triton kernels launched from torch equal the core reference byte for byte: copies on
random pools and plans, and the bookkeeping (add_requests, preprocess, resolve, accept +
post-process) on step sequences from the reference scheduler, pools compared every step.
On CPU the kernels run in Triton's interpreter; on the GPU machine the same tests run
compiled (``make gpu``)."""

import random

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_align.backends.torch import StateRunner
from mamba_align.core import (
    CacheConfig,
    ConvSpec,
    CopyPlan,
    Scheduler,
    TemporalSpec,
    accept,
    add_requests,
    apply_conv_copy,
    apply_copy,
    apply_temporal_copy,
    init_slots,
    pad_batch,
    postprocess,
    postprocess_copy_plan,
    precopy_plan,
    preprocess,
    resolve_slots,
)
from mamba_align.core.symbolic import Labels, symbolic_config, symbolic_forward, symbolic_pools

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL = 0x5A


def to_np(t):
    return t.detach().cpu().numpy()


def random_pool(gen, shape, dtype):
    """Random bits; bf16/fp16/fp32 NaN payloads included. Compared as bytes."""
    return torch.randint(-(2**15), 2**15, shape, generator=gen, dtype=torch.int32).to(
        torch.int16 if dtype in (torch.bfloat16, torch.float16) else torch.int32
    ).view(dtype)


def np_view(t):
    """A NumPy *copy* of a torch pool with the same bytes (bf16 through ml_dtypes); on the
    CPU ``.numpy()`` shares memory, and the reference must not write into the kernel's pool."""
    a = to_np(t.view(torch.int16) if t.dtype == torch.bfloat16 else t).copy()
    return a.view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else a


def same_bytes(t, a):
    return np.array_equal(to_np(t).view(np.uint8) if t.dtype != torch.bfloat16
                          else to_np(t.view(torch.int16)).view(np.uint8), a.view(np.uint8))


def random_copy_plan(rng, rows, nb, max_shift):
    """Rows with distinct destinations: plain copies, self-copies / in-place shifts,
    sources < 0 and skipped (-1) rows."""
    blocks = rng.permutation(np.arange(1, nb))
    dst = blocks[:rows].copy()
    spare = blocks[rows:]
    kind = rng.integers(0, 4, rows)  # 0 copy, 1 in place, 2 src -1, 3 skipped row
    tsrc = np.where(kind == 1, dst, rng.choice(spare, rows))
    csrc = np.where(kind == 1, dst, rng.choice(spare, rows))
    tsrc[kind >= 2] = -1
    csrc[kind >= 2] = -1
    dst[kind == 3] = -1
    shift = rng.integers(0, max_shift + 1, rows)
    return CopyPlan(tsrc.astype(np.int64), csrc.astype(np.int64), dst.astype(np.int64),
                    shift.astype(np.int64))


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_temporal_copy_kernel_is_byte_exact(rows, dtype, index_dtype):
    gen = torch.Generator().manual_seed(rows)
    rng = np.random.default_rng(rows)
    nb = 2 * rows + 3
    pool = random_pool(gen, (3, nb, 4, 8, 8), dtype)
    plan = random_copy_plan(rng, rows, nb, 0)
    want = np_view(pool)
    apply_temporal_copy(want, plan)
    t = pool.to(DEVICE, copy=True)
    idx = lambda a: torch.as_tensor(a, dtype=index_dtype, device=DEVICE)  # noqa: E731
    torch.ops.mamba_align.copy_temporal_(t, idx(plan.temporal_src), idx(plan.dst))
    assert same_bytes(t, want)


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("S", [0, 1, 3])
def test_conv_copy_kernel_is_byte_exact(rows, layout, dtype, S):
    gen = torch.Generator().manual_seed(7 * rows + S)
    rng = np.random.default_rng(7 * rows + S)
    nb, K, D = 2 * rows + 3, 4, 40
    W = K - 1 + S
    shape = (2, nb, W, D) if layout == "SD" else (2, nb, D, W)
    pool = random_pool(gen, shape, dtype)
    plan = random_copy_plan(rng, rows, nb, S)
    want = np_view(pool)
    apply_conv_copy(want, plan, layout)
    t = pool.to(DEVICE, copy=True)
    i64 = lambda a: torch.as_tensor(a, device=DEVICE)  # noqa: E731
    torch.ops.mamba_align.copy_conv_(t, i64(plan.conv_src), i64(plan.dst), i64(plan.shift), layout)
    assert same_bytes(t, want)


def test_copies_leave_untouched_blocks_and_padded_strides_alone():
    # A page-padded pool: blocks live inside a larger allocation; the padding must survive.
    base = torch.full((2, 6, 3 * 8 + 5), SENTINEL, dtype=torch.int32, device=DEVICE)
    pool = base[:, :, : 3 * 8].view(2, 6, 3, 8)  # block stride 29, layer stride 174
    pool[:, 2] = torch.arange(48, dtype=torch.int32, device=DEVICE).view(2, 3, 8)
    before = base.clone()
    i64 = lambda a: torch.tensor(a, device=DEVICE)  # noqa: E731
    torch.ops.mamba_align.copy_conv_(pool.view(torch.float32), i64([2]), i64([4]), i64([1]), "SD")
    torch.ops.mamba_align.copy_temporal_(pool.view(torch.float32), i64([2]), i64([5]))
    changed = (base != before).any(dim=-1).any(dim=0)
    assert changed.tolist() == [False, False, False, False, True, True]
    assert torch.equal(base[:, :, 24:], before[:, :, 24:])  # padding untouched
    assert torch.equal(pool[:, 4, :2], pool[:, 2, 1:]) and torch.equal(pool[:, 4, 2], before[:, 4, 16:24])
    assert torch.equal(pool[:, 5], pool[:, 2])


# -- bookkeeping kernels on scheduler step sequences -----------------------------------
def make_config(B, S, K=3, layout="SD"):
    return CacheConfig(B, S, 1, {"conv": ConvSpec(K, 4, layout), "ssm": TemporalSpec((2, 2))})


def drafter_for(seed):
    def drafter(req, m):
        rng = random.Random(hash((seed, req.req_id, req.known, m)))
        true = list(req.tokens[req.known : req.known + m])
        n = rng.randint(0, len(true))
        ok = rng.randint(0, n)
        return true[:ok] + [-2] * (n - ok)
    return drafter


class TwinDriver:
    """Runs every step through the core (NumPy) and through the torch kernels side by
    side, on symbolic label pools, and asserts both give the same bits at every stage."""

    def __init__(self, sched, mode, index_dtype, pad_seed=None):
        self.sched, self.mode = sched, mode
        cfg = sched.config
        self.sym = symbolic_config(cfg)
        self.np_pools = symbolic_pools(cfg, sched.pool.num_blocks)
        self.t_pools = {n: torch.from_numpy(p.copy()).to(DEVICE) for n, p in self.np_pools.items()}
        self.state = init_slots(sched.max_num_seqs)
        self.runner = StateRunner(self.sym, sched.max_num_seqs, DEVICE, mode, index_dtype)
        self.labels = Labels()
        self.truth = {}
        self.rng = random.Random(pad_seed) if pad_seed is not None else None
        self.steps = 0

    def prefix(self, rid, n):
        if rid not in self.truth:
            self.truth[rid] = self.labels.chain(self.sched.requests[rid].tokens)
        return 0 if n == 0 else self.truth[rid][n - 1]

    def check_state(self):
        for f in ("state_idx", "acc", "num_computed"):
            assert np.array_equal(to_np(getattr(self.runner, f)).astype(np.int64),
                                  getattr(self.state, f)), f

    def check_pools(self):
        for n in self.np_pools:
            assert np.array_equal(to_np(self.t_pools[n]), self.np_pools[n]), n

    def step(self):
        sched, cfg = self.sched, self.sched.config
        B, S = cfg.block_size, cfg.num_spec
        batch = sched.schedule()
        if self.rng is not None:
            batch = pad_batch(batch, sorted(self.rng.sample(range(batch.num_rows + 2), 2)))
        idx, q, spec, bt = batch.idx_mapping, batch.query_len, batch.is_spec, batch.block_table
        dt = self.runner.state_idx.dtype
        T = lambda a, d=dt: torch.as_tensor(np.ascontiguousarray(a), device=DEVICE).to(d)  # noqa: E731
        t_idx, t_q, t_spec, t_bt = T(idx), T(q), T(spec, torch.bool), T(bt)

        # seeding
        self.state = add_requests(self.state, batch.added_slots, batch.added_num_computed, B)
        self.runner.add_requests(T(batch.added_slots), T(batch.added_num_computed))
        self.check_state()
        live = idx >= 0
        nc_before = np.where(live, self.state.num_computed[np.where(live, idx, 0)], 0)

        # preprocess + pre-copy + resolve
        self.state, pre = preprocess(self.state, idx, q, B)
        if self.mode == "pre-copy":
            apply_copy(self.np_pools, self.sym, precopy_plan(bt, idx, pre))
        slots = resolve_slots(bt, idx, self.state, pre, q, spec, S, self.mode)
        ts = self.runner.preprocess(self.t_pools, t_idx, t_q, t_spec, t_bt)
        self.check_state()
        self.check_pools()
        for f in ("src_col", "src_off", "state_idx"):
            assert np.array_equal(to_np(getattr(ts, f)), getattr(pre, f)), f
        for f in ("temporal_read", "conv_read", "conv_read_off", "temporal_write", "conv_write"):
            assert np.array_equal(to_np(getattr(ts, f)), getattr(slots, f)), f

        # the symbolic forward on both pool sets (the same function, the same slots)
        prefix = [self.prefix(int(r), int(n)) if r >= 0 else 0 for r, n in zip(batch.req_ids, nc_before)]
        reads = symbolic_forward(self.np_pools, self.sym, slots, batch.tokens, prefix, spec, self.labels)
        host = {n: to_np(p).copy() for n, p in self.t_pools.items()}
        symbolic_forward(host, self.sym, slots, batch.tokens, prefix, spec, self.labels)
        for n in host:
            self.t_pools[n].copy_(torch.from_numpy(host[n]))
        for b in np.flatnonzero(live):  # and the reads were right
            rid = int(batch.req_ids[b])
            assert reads[b].temporal["ssm"] == self.prefix(rid, int(nc_before[b]))

        # accept + post-process
        ns = sched.sample(batch)
        self.state = accept(self.state, idx, q, ns, spec)
        self.state, post = postprocess(self.state, idx, B)
        apply_copy(self.np_pools, self.sym, postprocess_copy_plan(bt, idx, post))
        cache_col = self.runner.postprocess(self.t_pools, t_idx, t_q, t_spec, T(ns), t_bt)
        assert np.array_equal(to_np(cache_col), post.cache_col)
        self.check_state()
        self.check_pools()
        sched.update(batch, ns)
        self.steps += 1

    def run(self, arrivals):
        arrivals = dict(arrivals)
        t = 0
        while arrivals or self.sched.has_unfinished():
            for rid in [k for k, v in arrivals.items() if v[0] <= t]:
                _, prompt, output = arrivals.pop(rid)
                self.sched.add_request(rid, prompt, output)
            t += 1
            assert t < 2000
            if self.sched.has_unfinished():
                self.step()
        return self


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_bookkeeping_kernels_follow_a_fixed_workload(mode, index_dtype):
    cfg = make_config(4, 3, K=3, layout="DS")
    sched = Scheduler(cfg, 16, 3, 12, 64, drafter=drafter_for(1))
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    arrivals = {0: (0, prompt, list(range(10, 24))), 1: (0, prompt[:5], [3] * 9),
                2: (4, prompt + [1], [4] * 7), 3: (9, prompt + [2], [5] * 6)}
    d = TwinDriver(sched, mode, index_dtype, pad_seed=3).run(arrivals)
    assert d.steps > 10
    assert any(r.hit_tokens for r in sched.requests.values())


@st.composite
def small_scenarios(draw):
    B = draw(st.integers(1, 5))
    S = draw(st.sampled_from(sorted({0, B - 1, draw(st.integers(0, B - 1))})))
    tok = st.integers(0, 3)
    base = draw(st.lists(tok, min_size=0, max_size=2 * B))
    reqs = {}
    for rid in range(draw(st.integers(1, 4))):
        prompt = base + draw(st.lists(tok, min_size=0 if base else 1, max_size=B + 1))
        reqs[rid] = (draw(st.integers(0, 4)), prompt, draw(st.lists(tok, min_size=1, max_size=2 * B + 2)))
    return dict(cfg=make_config(B, S, draw(st.integers(2, 4)), draw(st.sampled_from(["SD", "DS"]))),
                arrivals=reqs, num_blocks=draw(st.integers(S + 4, 2 * (S + 4))),
                max_num_seqs=draw(st.integers(1, 3)), max_num_tokens=draw(st.integers(B, 2 * B + S)),
                seed=draw(st.integers(0, 2**31)), mode=draw(st.sampled_from(["pre-copy", "copy-free"])),
                pad=draw(st.booleans()))


@settings(max_examples=int(__import__("os").environ.get("KERNEL_EXAMPLES", "25")))
@given(small_scenarios())
def test_bookkeeping_kernels_on_random_streams(sc):
    sched = Scheduler(sc["cfg"], sc["num_blocks"], sc["max_num_seqs"], sc["max_num_tokens"], 64,
                      drafter=drafter_for(sc["seed"]))
    TwinDriver(sched, sc["mode"], torch.int32, sc["seed"] if sc["pad"] else None).run(sc["arrivals"])
