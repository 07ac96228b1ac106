"""What the torch launcher does with tensors torch itself would treat differently
(backends/torch/ops.py): gradients (refused or raising in backward, as JAX raises),
version counters of the arrays an op updates, devices, and inputs it copies to aligned
storage."""

import pytest
import torch
from backend_args import DEV, Args

from mamba_align.backends.torch import ops as tops


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device kind")
def test_torch_arrays_on_mixed_devices_are_rejected():
    pool = torch.zeros(2, 6, 3, 4, device=DEV)
    with pytest.raises(ValueError, match="is on cpu, expected cuda"):
        tops.copy_temporal_(pool, Args("torch").err(), torch.tensor([1]), torch.tensor([2]))


def test_torch_meta_tensors_are_rejected():
    # compiled or interpreted, a tensor without data is refused by name, before any launch
    x, w = torch.empty(3, 8, device="meta"), torch.empty(8, device="meta")
    with pytest.raises(ValueError, match="the tensors are on meta"):
        tops.rms_norm(x, w)


def test_torch_gradients_through_the_ops_raise():
    # as JAX's do: a launch's outputs have no autograd history, so an input that wants a
    # gradient would silently get none through them
    x = torch.randn(3, 8, device=DEV, requires_grad=True)
    w = torch.randn(8, device=DEV)
    y = tops.rms_norm(x, w)["y"]
    with pytest.raises(RuntimeError, match="rms_norm is not differentiable"):
        (y.sum() + x.sum()).backward()
    # an op that updates in place: torch's own refusal (it takes no formula for one)
    pool = torch.zeros(1, 2, 3, 8, device=DEV)
    ids = [torch.tensor(v, dtype=torch.int32, device=DEV) for v in ([0, 1], [-1], [0], [1], [0])]
    out = tops.conv1d_update_(pool, tops_errors(), x[:1], torch.randn(8, 4, device=DEV),
                              torch.zeros(8, device=DEV), *ids, layer=0, layout="SD")
    with pytest.raises(RuntimeError, match="conv1d_update_"):
        (out["y"].sum() + x.sum()).backward()
    # without gradients wanted, a plain launch; the same values either way
    with torch.no_grad():
        plain = tops.rms_norm(x, w)["y"]
    assert plain.grad_fn is None and torch.equal(plain, y.detach())
    assert tops.rms_norm(x.detach(), w)["y"].grad_fn is None
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):  # still named
        tops.rms_norm(x.detach().cpu().numpy(), w)


def tops_errors():
    return torch.zeros(2, dtype=torch.int32, device=DEV)


def _conv_args(pool):
    ids = [torch.tensor(v, dtype=torch.int32, device=DEV) for v in ([0, 1], [1], [0], [2], [0])]
    return (pool, tops_errors(), torch.randn(1, 8, device=DEV), torch.randn(8, 4, device=DEV),
            torch.zeros(8, device=DEV), *ids)


@pytest.mark.parametrize("leaf", [True, False])
def test_torch_refuses_a_pool_that_requires_grad(leaf):
    # no backward can see the update: the gradient would flow as if the op had not run
    # (JAX raises "not differentiable" on the same function)
    base = torch.randn(1, 4, 3, 8, device=DEV, requires_grad=True)
    pool = base if leaf else base * 2
    before = pool.detach().clone()
    with pytest.raises(RuntimeError, match="conv1d_update_ updates pool in place and pool "
                                           "requires grad"):
        tops.conv1d_update_(*_conv_args(pool), layer=0, layout="SD")
    assert torch.equal(pool.detach(), before)  # refused before the launch
    with torch.no_grad():  # allowed there, as torch's own in-place ops are
        tops.conv1d_update_(*_conv_args(pool), layer=0, layout="SD")
    assert not torch.equal(pool.detach(), before)


def test_torch_in_place_updates_bump_the_version_counter():
    # as torch's own in-place ops do: a tensor autograd saved before the update then makes
    # backward raise instead of using the new values
    pool = torch.zeros(1, 4, 3, 8, device=DEV)
    a = torch.ones(1, 4, 3, 8, device=DEV, requires_grad=True)
    prod = a * pool  # saves pool for a's gradient
    args = _conv_args(pool)
    v0, e0 = pool._version, args[1]._version
    tops.conv1d_update_(*args, layer=0, layout="SD")
    assert pool._version > v0 and args[1]._version > e0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        prod.sum().backward()


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_torch_version_bumps_pass_over_inference_tensors(monkeypatch, one_at_a_time):
    # an inference tensor has no version counter; torch 2.4 (which pyproject allows) takes
    # one tensor at a time and raises on an inference tensor outside inference mode:
    # emulated here, where it raises, the launcher must still complete
    from mamba_align.backends.torch import ops as backend
    real = backend.increment_version
    seen = []

    def torch_2_4(t):
        if not isinstance(t, torch.Tensor):
            raise RuntimeError("increment_version expect a Tensor as input")
        if t.is_inference():
            raise RuntimeError("Inplace update to inference tensor outside InferenceMode")
        seen.append(t)
        real(t)
    if one_at_a_time:
        monkeypatch.setattr(backend, "increment_version", torch_2_4)
        monkeypatch.setattr(backend, "_BUMP_LIST", False)
    with torch.inference_mode():
        frozen = torch.zeros(1, 4, 3, 8, device=DEV)
    pool = torch.zeros(1, 4, 3, 8, device=DEV)
    for p in (frozen, pool):
        args = _conv_args(p)
        v0 = None if p.is_inference() else p._version
        with torch.no_grad():
            tops.conv1d_update_(*args, layer=0, layout="SD")
        assert p.is_inference() or p._version > v0
        assert not torch.equal(p, torch.zeros_like(p))  # written
    assert not one_at_a_time or any(t is pool for t in seen)


@pytest.mark.parametrize("grad_input", [False, True])
def test_torch_a_refused_call_leaves_the_version_counter(grad_input):
    # as torch's own in-place ops: a call refused before its kernel changes nothing, also
    # on the custom op's path (an input that requires grad), where torch bumps the arrays
    # an op updates before the op runs
    pool = torch.zeros(1, 4, 3, 8, device=DEV)
    args = list(_conv_args(pool))
    args[1] = torch.zeros(2, dtype=torch.int64, device=DEV)  # the flag must be int32
    if grad_input:
        args[3].requires_grad_()  # the weight
    v0 = pool._version
    with pytest.raises(TypeError, match="errors"):
        tops.conv1d_update_(*args, layer=0, layout="SD")
    assert pool._version == v0


def test_torch_copies_a_misaligned_broadcast_input_whole():
    # the launcher copies an input off a 16-byte boundary to aligned storage with the same
    # strides; a broadcast row (stride 0) cannot be copied element by element into such a
    # layout, so its span is copied (GPU launches only take this path: called directly)
    from mamba_align.backends.torch import ops as backend
    src = torch.arange(40, dtype=torch.float32).view(5, 8)
    x = src[1:2].expand(3, 8)[:, 1:]  # strides (0, 1), 36 bytes past src's start
    assert x.data_ptr() % 16 and x.stride() == (0, 1)

    class Plan:
        inputs, aliases = ("x",), {}
    args = {"x": x}
    backend._align_inputs(Plan, args)
    got = args["x"]
    assert got.data_ptr() % 16 == 0 and got.stride() == x.stride() and torch.equal(got, x)
    y = src[:, 1:5]  # an ordinary misaligned view: same strides, its own storage
    args = {"x": y}
    backend._align_inputs(Plan, args)
    assert args["x"].data_ptr() % 16 == 0 and args["x"].stride() == (8, 1)
    assert torch.equal(args["x"], y)


def test_the_public_ops_carry_type_hints_and_name_what_they_return():
    # typing.get_type_hints (IDEs, mypy's runtime view) reads __annotations__, not the
    # signature the launcher builds
    import typing
    hints = typing.get_type_hints(tops.gated_delta_rule_)
    assert hints["q"] is torch.Tensor and hints["layer"] is int and hints["scale"] is float
    assert hints["return"] == typing.Dict[str, torch.Tensor]
    assert typing.get_type_hints(tops.copy_temporal_)["return"] is type(None)
    assert "Returns a dict of the new outputs: ``o``; ``pool``, ``errors`` updated in place" \
        in tops.gated_delta_rule_.__doc__
