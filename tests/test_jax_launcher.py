"""What the JAX launcher does with arrays JAX itself would change (backends/jax/ops.py and
bridge.py): values narrowed without x64 (refused or saturated, never wrapped onto a valid
id), float64 data, arrays on several devices, static checks under ``jax.jit``, gradients
(refused, as torch's backward raises) and ``jax.vmap`` on the CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from backend_args import CFG, DEV, Args

from mamba_align.backends import jax as mj
from mamba_align.backends.torch import ops as tops


def test_jax_bridge_scalars_are_python_numbers():
    from mamba_align.backends.jax.bridge import _scalar

    assert _scalar("x", 3) == 3 and isinstance(_scalar("x", 0.5), np.float32)
    with pytest.raises(TypeError, match="scalar x"):
        _scalar("x", np.int64(3))
    with pytest.raises(TypeError, match="scalar x"):
        _scalar("x", True)


def test_jax_checks_are_static_under_jit():
    # the checks read shapes and dtypes only, so they run (and raise) at trace time
    bad = jax.jit(lambda s: mj.ops.copy_temporal(jnp.zeros((1, 4, 2)), Args("jax").err(), s,
                                                 jnp.zeros(2, jnp.int32)))
    with pytest.raises(ValueError, match="dst must have shape"):
        bad(jnp.zeros(1, jnp.int32))


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="with x64 int64 state is kept")
def test_jax_int64_state_without_x64_is_refused_clearly():
    # JAX without x64 would hand back int32 arrays for int64 ones updated in place
    state = mj.SlotArrays(np.full(4, -1, np.int64), np.ones(4, np.int64), np.zeros(4, np.int64),
                          mj.init_state(4).errors)
    with pytest.raises(TypeError, match="state_idx is int64, which JAX without jax_enable_x64"):
        mj.add_requests(state, np.array([0]), np.array([5]), config=CFG)
    # read-only int64 NumPy ids are fine (stored as int32), and int32 state works
    out = mj.add_requests(state._replace(**{f: np.asarray(getattr(state, f)).astype(np.int32)
                                            for f in ("state_idx", "acc", "num_computed")}),
                          np.array([0]), np.array([5]), config=CFG)
    assert np.asarray(out.state_idx).tolist() == [1, -1, -1, -1]


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="with x64 int64 state is kept")
def test_jax_refuses_what_it_would_narrow_as_torch_refuses_it():
    # float64 NumPy data (JAX without x64 would run it as float32; torch refuses float64),
    # an int64 error flag (the flag is int32 with or without x64), int64 state asked of
    # init_state (JAX would hand back int32), each with torch's wording where it has one
    with pytest.raises(TypeError, match="x must have dtype float32/float16/bfloat16, got "
                                        "float64"):
        mj.ops.rms_norm(np.ones((2, 8)), np.ones(8, np.float32))
    with pytest.raises(TypeError, match="errors must have dtype int32, got int64"):
        mj.ops.copy_temporal(jnp.zeros((1, 4, 2)), np.zeros(2, np.int64),
                             jnp.array([1], jnp.int32), jnp.array([2], jnp.int32))
    with pytest.raises(TypeError, match="dtype int64 needs jax_enable_x64"):
        mj.init_state(4, jnp.int64)
    with pytest.raises(TypeError, match="x must be a jax or numpy array, got Tensor"):
        mj.ops.rms_norm(torch.ones(2, 8), np.ones(8, np.float32))


def test_jax_arrays_on_several_devices_are_refused_by_name(tmp_path):
    # two CPU devices need XLA_FLAGS before jax is imported: a process of its own
    import subprocess
    import sys
    script = tmp_path / "devices.py"
    script.write_text("""
import numpy as np, jax, jax.numpy as jnp
from mamba_align.backends import jax as mj
from mamba_align.core import new_errors
d0, d1 = jax.devices()[:2]
src, dst = jnp.array([1], jnp.int32), jnp.array([2], jnp.int32)
pool = jax.device_put(jnp.arange(16.0).reshape(1, 4, 2, 2), d1)
out = mj.ops.copy_temporal(pool, jnp.asarray(new_errors()), src, dst)  # the rest moves
assert out["pool"].devices() == {d1}, out["pool"].devices()
assert np.asarray(out["pool"])[0, 2].tolist() == np.asarray(pool)[0, 1].tolist()
for errors, want in ((jax.device_put(jnp.asarray(new_errors()), d0), "errors is on"),):
    try:
        mj.ops.copy_temporal(pool, errors, src, dst)
        raise SystemExit("mixed devices were not refused")
    except ValueError as e:
        assert want in str(e) and "(as pool)" in str(e), e
mesh = jax.sharding.Mesh(np.array([d0, d1]), ("x",))
spread = jax.device_put(jnp.zeros((1, 4, 2, 2)), jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec(None, "x")))
try:
    mj.ops.copy_temporal(spread, jnp.asarray(new_errors()), src, dst)
    raise SystemExit("a sharded pool was not refused")
except ValueError as e:
    assert "pool is placed on 2 devices" in str(e), e
# under jax.jit XLA places the arrays, those the function closes over too
w1, x0 = jax.device_put(jnp.ones(8), d1), jax.device_put(jnp.ones((2, 8)), d0)
for f in (lambda x: mj.ops.rms_norm(x, w1)["y"], lambda x: mj.ops.rms_norm(x0, w1)["y"]):
    assert np.allclose(np.asarray(jax.jit(f)(x0)), 1, atol=1e-5)
# a launch with no rows runs nothing, and still refuses
try:
    mj.ops.copy_temporal(pool, jax.device_put(jnp.asarray(new_errors()), d0),
                         jnp.zeros(0, jnp.int32), jnp.zeros(0, jnp.int32))
    raise SystemExit("mixed devices were not refused on an empty launch")
except ValueError as e:
    assert "errors is on" in str(e), e
print("ok")
""")
    env = dict(__import__("os").environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu", TRITON_INTERPRET="1")  # (also on a GPU machine)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300, env=env, cwd=str(__import__("pathlib").Path(__file__)
                                                    .resolve().parents[1]))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="with x64 int64 ids are kept")
@pytest.mark.parametrize("bad", [2**32 + 1, -(2**32) - 1, 2**40])
def test_jax_int64_ids_outside_int32_stay_bad_without_x64(bad):
    # 2**32 + 1 would wrap to block 1 and -2**32 - 1 to -1 ("none"): saturated, they stay
    # out of range, and JAX flags and skips the rows as torch does
    from mamba_align.core import decode_errors

    def run(name, op, pool, floats, ids, **opts):
        # the ids as NumPy int64 arrays, as users pass them (torch: int64 tensors)
        a = Args(name)
        pool, err = a.f32(*pool), a.err()
        ids = [np.array(v, np.int64) for v in ids]
        if name == "torch":
            getattr(tops, op + "_")(pool, err, *floats,
                                    *[torch.as_tensor(v, device=DEV) for v in ids], **opts)
            pool, err = pool.cpu(), err.cpu()
        else:
            out = getattr(mj.ops, op)(pool, err, *floats, *ids, **opts)
            pool, err = out["pool"], out["errors"]
        return np.asarray(pool).tolist(), decode_errors(np.asarray(err))

    def launches(name):
        a = Args(name)
        xs = [a.f32(1, 2), a.f32(2, 4), a.f32(2)]  # x, weight, bias
        conv = lambda cu, wb: run(name, "conv1d_update", (1, 4, 3, 2), xs,  # noqa: E731
                                  [cu, [1], [0], wb, [0]], layer=0, layout="SD")
        return [run(name, "copy_temporal", (1, 4, 2), [], [[bad], [2]]),
                conv([0, 1], [bad]),  # the write block
                conv([0, bad], [2])]  # the row's cu_seqlens

    torch_out, jax_out = launches("torch"), launches("jax")
    assert jax_out == torch_out
    untouched = (np.asarray(Args("jax").f32(1, 4, 2)).tolist(),
                 np.asarray(Args("jax").f32(1, 4, 3, 2)).tolist())
    assert [p for p, _ in jax_out] == [untouched[0], untouched[1], untouched[1]]
    assert all(faults for _, faults in jax_out)  # every launch flagged


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="with x64 int64 counts are kept")
@pytest.mark.parametrize("count", [2**31, 2**32 + 5, 2**40, -(2**32) + 5])
def test_jax_counts_past_its_32_bit_state_are_refused_as_a_negative_count_is(count):
    # an int32 state cannot hold the count: clipped to 2**31 - 1 it would pass as a valid
    # count, wrapped it could be 5; it must be refused like any bad count (slot left
    # faulty, the count not stored)
    from mamba_align.core import Fault

    def seed(c):
        out = mj.ops.add_requests(*mj.init_state(4), np.array([1], np.int64),
                                  np.array([c], np.int64), block_size=CFG.block_size)
        return {n: np.asarray(v).tolist() for n, v in out.items()}
    got, refused = seed(count), seed(-5)
    assert got == refused
    assert got["errors"][0] & Fault.BAD_NUM_COMPUTED and got["num_computed"] == [0] * 4


def test_jax_gradients_through_the_ops_raise():
    pool = jnp.ones((1, 4, 2, 2))
    src, dst = jnp.array([1], jnp.int32), jnp.array([2], jnp.int32)
    err = Args("jax").err()
    with pytest.raises(TypeError, match="copy_temporal is not differentiable"):
        jax.grad(lambda p: mj.ops.copy_temporal(p, err, src, dst)["pool"].sum())(pool)
    with pytest.raises(TypeError, match="copy_temporal is not differentiable"):
        jax.jit(jax.grad(lambda p: mj.ops.copy_temporal(p, err, src, dst)["pool"].sum()))(pool)
    # stopped gradients pass: the op sees a constant
    g = jax.grad(lambda p: (p + mj.ops.copy_temporal(jax.lax.stop_gradient(p), err, src,
                                                     dst)["pool"]).sum())(pool)
    assert np.asarray(g).tolist() == np.ones((1, 4, 2, 2)).tolist()


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="CPU only (README): jax-triton has no batching rule on the GPU")
def test_jax_vmap_over_an_op_is_a_loop_of_calls():
    # the README's claim: on the CPU, vmap over an op gives each element's own call
    rng = np.random.default_rng(3)
    pools = jnp.asarray(rng.normal(size=(3, 1, 4, 2, 2)).astype(np.float32))
    src = jnp.array([[1], [2], [-1]], jnp.int32)
    dst = jnp.array([[2], [0], [3]], jnp.int32)
    err = Args("jax").err()
    got = jax.vmap(lambda p, s, d: mj.ops.copy_temporal(p, err, s, d)["pool"])(pools, src, dst)
    for i in range(3):
        one = mj.ops.copy_temporal(pools[i], err, src[i], dst[i])["pool"]
        assert np.asarray(got[i]).tobytes() == np.asarray(one).tobytes()
    assert not np.array_equal(np.asarray(got[0]), np.asarray(pools[0]))  # a copy happened


def test_the_public_ops_carry_type_hints_and_name_what_they_return():
    import typing
    hints = typing.get_type_hints(mj.ops.conv1d_update)
    assert hints["x"] is jax.Array and hints["layout"] is str
    assert hints["return"] == typing.Dict[str, jax.Array]
    assert "every output by name: ``y``, ``pool``, ``errors``" in mj.ops.conv1d_update.__doc__
