"""Cross-backend equivalence: every step of reference-scheduler runs goes through the core
(NumPy), the torch backend and the JAX backend side by side, and all three must agree bit
for bit at every stage: bookkeeping after add_requests / preprocess / post-process, the
pre-copy and post-process copies (whole pools compared), the resolved kernel blocks and the
prefix-cache columns. Pools are symbolic (every state a label of its token prefix), so the
runs also prove each row read the right state.

On CPU both backends run the kernels in Triton's interpreter (JAX through
``jax.pure_callback``); on the GPU machine compiled Triton on both sides, jax-triton for
JAX (``make gpu``).
"""

import random

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_align.backends import jax as mj
from mamba_align.backends.torch import StateRunner
from mamba_align.core import (
    CacheConfig,
    ConvSpec,
    Scheduler,
    TemporalSpec,
    accept,
    add_requests,
    apply_copy,
    init_slots,
    pad_batch,
    random_drafter,
    postprocess,
    postprocess_copy_plan,
    precopy_plan,
    preprocess,
    resolve_blocks,
)
from mamba_align.core.symbolic import Labels, symbolic_config, symbolic_forward, symbolic_pools
from support import in_flight

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# eager JAX calls on the GPU copy their in-place arrays (and say so once); expected here
pytestmark = pytest.mark.filterwarnings("ignore:.*called outside jax.jit")


def make_config(B, S, K=3, layout="SD"):
    return CacheConfig(B, S, 1, {"conv": ConvSpec(K, 4, layout), "ssm": TemporalSpec((2, 2))})


def host(x):
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def same(name, want, *got):
    want = np.asarray(want)
    for g in got:
        g = host(g)
        assert g.shape == want.shape and np.array_equal(g.astype(np.int64), want.astype(np.int64)), name


class TriDriver:
    """Core, torch and JAX side by side over one scheduler run."""

    def __init__(self, sched, mode, index_dtype=torch.int32, pad_seed=None):
        self.sched, self.mode = sched, mode
        self.sym = symbolic_config(sched.config)
        self.np_pools = symbolic_pools(sched.config, sched.pool.num_blocks)
        self.t_pools = {n: torch.from_numpy(p.copy()).to(DEVICE) for n, p in self.np_pools.items()}
        # JAX runs without x64 here: label pools as int32 (labels stay small)
        self.j_pools = {n: jnp.asarray(p.astype(np.int32)) for n, p in self.np_pools.items()}
        self.state = init_slots(sched.max_num_seqs)
        self.t_run = StateRunner(self.sym, sched.max_num_seqs, DEVICE, mode, index_dtype)
        self.j_state = mj.init_state(sched.max_num_seqs)
        self.labels = Labels()
        self.truth = {}
        self.rng = random.Random(pad_seed) if pad_seed is not None else None
        self.steps = 0

    def prefix(self, rid, n):
        if rid not in self.truth:
            self.truth[rid] = self.labels.chain(self.sched.requests[rid].tokens)
        return 0 if n == 0 else self.truth[rid][n - 1]

    def check_state(self, in_step=None):
        """The device bookkeeping equals the core's (after preprocess, ``in_step`` = the
        step's rows: their slots' acc negated, the device's mark of a step in flight)."""
        want = self.state if in_step is None else in_flight(self.state, in_step)
        for f in ("state_idx", "acc", "num_computed"):
            same(f, getattr(want, f), getattr(self.t_run, f), getattr(self.j_state, f))

    def check_pools(self):
        for n in self.np_pools:
            same(f"pool {n}", self.np_pools[n], self.t_pools[n], self.j_pools[n])

    def step(self):
        sched, cfg = self.sched, self.sched.config
        B, S = cfg.block_size, cfg.num_spec
        batch = sched.schedule()
        if self.rng is not None:
            batch = pad_batch(batch, sorted(self.rng.sample(range(batch.num_rows + 2), 2)))
        idx, q, spec, bt = batch.idx_mapping, batch.query_len, batch.is_spec, batch.block_table
        dt = self.t_run.state_idx.dtype
        T = lambda a, d=dt: torch.as_tensor(np.ascontiguousarray(a), device=DEVICE).to(d)  # noqa: E731
        J = lambda a, d=jnp.int32: jnp.asarray(np.asarray(a), dtype=d)  # noqa: E731
        t_in = (T(idx), T(q), T(spec, torch.bool), T(bt))
        j_in = (J(idx), J(q), J(spec, jnp.bool_), J(bt))

        self.state = add_requests(self.state, batch.added_slots, batch.added_num_computed, B)
        self.t_run.add_requests(T(batch.added_slots), T(batch.added_num_computed))
        self.j_state = mj.add_requests(self.j_state, J(batch.added_slots),
                                       J(batch.added_num_computed), config=self.sym)
        self.check_state()
        live = idx >= 0
        nc_before = np.where(live, self.state.num_computed[np.where(live, idx, 0)], 0)

        self.state, pre = preprocess(self.state, idx, q, B)
        if self.mode == "pre-copy":
            apply_copy(self.np_pools, self.sym, precopy_plan(bt, idx, pre))
        blocks = resolve_blocks(bt, idx, self.state, pre, q, spec, S, self.mode)
        ts = self.t_run.preprocess(self.t_pools, *t_in)
        self.j_state, self.j_pools, js = mj.preprocess(self.j_state, self.j_pools, *j_in,
                                                       config=self.sym, mode=self.mode)
        self.check_state(in_step=idx)
        self.check_pools()
        for f in ("src_col", "src_bias", "run_col"):
            same(f, getattr(pre, f), getattr(ts, f), getattr(js, f))
        for f in ("temporal_read", "conv_read", "conv_read_bias", "temporal_write", "conv_write"):
            same(f, getattr(blocks, f), getattr(ts, f), getattr(js, f))

        # the symbolic forward, once, on the core pools; its writes are mirrored to the others
        prefix = [self.prefix(int(r), int(n)) if r >= 0 else 0
                  for r, n in zip(batch.req_ids, nc_before)]
        reads = symbolic_forward(self.np_pools, self.sym, blocks, batch.tokens, prefix, spec,
                                 self.labels)
        for b in np.flatnonzero(live):
            rid, n = int(batch.req_ids[b]), int(nc_before[b])
            assert reads[b].temporal["ssm"] == self.prefix(rid, n)
            for name, st in self.sym.states.items():  # the inputs of the last K - 1 tokens
                if isinstance(st, ConvSpec):
                    want = tuple(self.prefix(rid, p + 1) if p >= 0 else 0
                                 for p in range(n - st.kernel_size + 1, n))
                    assert reads[b].conv[name] == want, (name, b)
        for n, p in self.np_pools.items():
            self.t_pools[n].copy_(torch.from_numpy(p.copy()))
            self.j_pools[n] = jnp.asarray(p.astype(np.int32))

        ns = sched.sample(batch)
        self.state = accept(self.state, idx, q, ns, spec)
        self.state, post = postprocess(self.state, idx, B)
        apply_copy(self.np_pools, self.sym, postprocess_copy_plan(bt, idx, post))
        t_cache = self.t_run.postprocess(self.t_pools, t_in[0], t_in[1], t_in[2], T(ns), t_in[3])
        self.j_state, self.j_pools, j_cache = mj.postprocess(
            self.j_state, self.j_pools, j_in[0], j_in[1], j_in[2], J(ns), j_in[3], config=self.sym)
        same("cache_col", post.cache_col, t_cache, j_cache)
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
def test_three_way_on_a_fixed_workload(mode, index_dtype):
    cfg = make_config(4, 3, K=3, layout="DS")
    sched = Scheduler(cfg, 16, 3, 12, 64, drafter=random_drafter(1))
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    arrivals = {0: (0, prompt, list(range(10, 24))), 1: (0, prompt[:5], [3] * 9),
                2: (4, prompt + [1], [4] * 7), 3: (9, prompt + [2], [5] * 6)}
    d = TriDriver(sched, mode, index_dtype, pad_seed=3).run(arrivals)
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
        reqs[rid] = (draw(st.integers(0, 4)), prompt,
                     draw(st.lists(tok, min_size=1, max_size=2 * B + 2)))
    return dict(cfg=make_config(B, S, draw(st.integers(2, 4)), draw(st.sampled_from(["SD", "DS"]))),
                arrivals=reqs, num_blocks=draw(st.integers(S + 4, 2 * (S + 4))),
                max_num_seqs=draw(st.integers(1, 3)),
                max_num_tokens=draw(st.integers(B, 2 * B + S)), seed=draw(st.integers(0, 2**31)),
                mode=draw(st.sampled_from(["pre-copy", "copy-free"])), pad=draw(st.booleans()))


@settings(max_examples=int(__import__("os").environ.get("EQUIVALENCE_EXAMPLES", "25")))
@given(small_scenarios())
def test_three_way_on_random_streams(sc):
    sched = Scheduler(sc["cfg"], sc["num_blocks"], sc["max_num_seqs"], sc["max_num_tokens"], 64,
                      drafter=random_drafter(sc["seed"]))
    TriDriver(sched, sc["mode"], torch.int32, sc["seed"] if sc["pad"] else None).run(sc["arrivals"])


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
def test_torch_and_jax_agree_on_padded_and_out_of_range_rows(mode):
    """Rows the core would reject (a slot outside the arrays) are skipped by the kernels,
    the same way in both backends; the other rows equal the core's."""
    from support import Jax, Reference, Torch

    rng = np.random.default_rng(11)
    B, S, n_slots, rows, cols = 4, 2, 10, 7, 6
    idx = rng.permutation(n_slots)[:rows]
    idx[[1, 4]] = [-1, 99]  # a padded row and an out-of-range slot: both skipped
    q = rng.integers(1, 1 + S + 1, rows)
    spec = rng.integers(0, 2, rows).astype(bool)
    bt = rng.integers(1, 50, (n_slots, cols))
    nc = rng.integers(0, 3 * B, n_slots)
    seeded = add_requests(init_slots(n_slots), np.arange(n_slots), nc, B)
    t_state, t_out = Torch().preprocess_resolve(seeded, idx, q, spec, bt, B, S, mode)
    j_state, j_out = Jax().preprocess_resolve(seeded, idx, q, spec, bt, B, S, mode)
    for f in ("state_idx", "acc", "num_computed"):
        assert np.array_equal(getattr(t_state, f), getattr(j_state, f)), f
    assert t_out.keys() == j_out.keys()
    for n in t_out:
        assert np.array_equal(t_out[n], j_out[n]), n
    good = idx.copy()
    good[4] = -1  # the core, with the out-of-range row padded instead
    r_state, r_out = Reference().preprocess_resolve(seeded, good, q, spec, bt, B, S, mode)
    for f in ("state_idx", "acc", "num_computed"):
        assert np.array_equal(getattr(r_state, f), getattr(t_state, f)), f
    for n in r_out:
        assert np.array_equal(r_out[n], t_out[n]), n
