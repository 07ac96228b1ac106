"""The hybrid model of ``hybrid_model.py`` on the library's kernels, from torch: one step's
forward pass over a varlen batch, reading and writing the state blocks a runner resolved.

Every arithmetic operation is a kernel of the library (or an fp32 addition, which is exact
IEEE in either framework); slices are made contiguous, as JAX's are, and the tokens and
``cu_seqlens`` are int32, as JAX's are without x64 (the block ids of torch's runner are
int64: an index dtype, which changes no arithmetic), so a row's logits are the same bits
in either framework and in any batch.
"""

from __future__ import annotations

from typing import Dict, Mapping

import ml_dtypes
import numpy as np
import torch
from hybrid_model import Blocks, ModelConfig, check_weights

from mamba_align.backends.torch import ops
from mamba_align.core import new_errors, raise_errors


def to_torch(a: np.ndarray, device) -> torch.Tensor:
    """A NumPy array (bf16 through ml_dtypes) as a tensor on ``device``."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a NumPy array (bf16 through ml_dtypes, bit for bit)."""
    if t.dtype == torch.bfloat16:
        return t.detach().cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.detach().cpu().numpy()


class TorchModel:
    """The model's weights on ``device``; :meth:`forward` runs one step."""

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, np.ndarray], device,
                 reduce=None):
        """``reduce``: applied to the fp32 outputs of ``w_o`` and ``w_down`` before the
        residual adds them (a tensor-parallel shard's all-reduce; none by default)."""
        check_weights(cfg, weights)
        self.cfg, self.device = cfg, torch.device(device)
        self.w: Dict[str, torch.Tensor] = {n: to_torch(a, device) for n, a in weights.items()}
        self.reduce = reduce or (lambda t: t)

    def forward(self, pools: Mapping[str, torch.Tensor], errors: torch.Tensor,
                tokens: torch.Tensor, cu_seqlens: torch.Tensor, blocks,
                is_spec: torch.Tensor) -> torch.Tensor:
        """Logits fp32 ``[T, vocab]`` of the batch's ``tokens`` (int ``[T]``, rows by
        ``cu_seqlens`` ``[N + 1]``). ``blocks``: the runner's resolved blocks (its
        ``temporal_read``, ``conv_read``, ``conv_read_bias``, ``temporal_write``,
        ``conv_write``, ``[N]`` / ``[N, 1 + S]``); ``pools["conv"]``, ``pools["ssm"]`` are
        updated in place; faulty ids are ORed into ``errors``."""
        cfg, w = self.cfg, self.w
        H, HV, K, V = cfg.heads, cfg.value_heads, cfg.head_k, cfg.head_v
        T = tokens.shape[0]
        x = w["embed"][tokens].float()  # the residual stream, fp32
        dt = w["embed"].dtype
        for i in range(cfg.layers):
            p = f"l{i}."
            h = ops.rms_norm(x.to(dt), w[p + "norm1"], eps=cfg.eps)["y"]
            proj = ops.linear(h, w[p + "w_qkvz"])["y"]
            mixed, z = proj[:, :cfg.d_conv].contiguous(), proj[:, cfg.d_conv:].contiguous()
            y = ops.conv1d_update_(pools["conv"], errors, mixed, w[p + "conv_w"],
                                   w[p + "conv_b"], cu_seqlens, blocks.conv_read,
                                   blocks.conv_read_bias, blocks.conv_write, is_spec, layer=i,
                                   layout="DS", activation="silu")["y"]
            q = y[:, :H * K].contiguous().view(T, H, K)
            k = y[:, H * K:2 * H * K].contiguous().view(T, H, K)
            v = y[:, 2 * H * K:].contiguous().view(T, HV, V)
            if cfg.mixer == "mamba2":  # q, k, v are C, B, x
                o = ops.selective_state_update_(
                    pools["ssm"], errors, v, ops.linear(h, w[p + "w_dt"])["y"], w[p + "A"], k,
                    q, w[p + "D"], w[p + "dt_bias"], cu_seqlens, blocks.temporal_read,
                    blocks.temporal_write, is_spec, layer=i)["y"]
            else:
                ba = ops.linear(h, w[p + "w_ba"])["y"]
                b, a = ba[:, :HV].contiguous(), ba[:, HV:].contiguous()
                o = ops.gated_delta_rule_fused_gates_(
                    pools["ssm"], errors, q, k, v, a, b, w[p + "A_log"], w[p + "dt_bias"],
                    cu_seqlens, blocks.temporal_read, blocks.temporal_write, is_spec, layer=i,
                    use_qk_l2norm=True)["o"]
            o = ops.rms_norm_gated(o.view(T * HV, V), z.view(T * HV, V), w[p + "onorm"],
                                   eps=cfg.eps)["y"]
            x = x + self.reduce(ops.linear(o.view(T, HV * V), w[p + "w_o"])["y"].float())
            h2 = ops.rms_norm(x.to(dt), w[p + "norm2"], eps=cfg.eps)["y"]
            m = ops.silu_mul(ops.linear(h2, w[p + "w_gate"])["y"],
                             ops.linear(h2, w[p + "w_up"])["y"])["y"]
            x = x + self.reduce(ops.linear(m, w[p + "w_down"])["y"].float())
        h = ops.rms_norm(x.to(dt), w["norm_f"], eps=cfg.eps)["y"]
        return ops.linear(h, w["lm_head"])["y"].float()


def new_pools(cache, num_blocks: int, device) -> Dict[str, torch.Tensor]:
    """Zeroed pools of every state of ``cache`` (a ``CacheConfig``) in their dtypes."""
    return {n: torch.zeros(cache.pool_shape(n, num_blocks), device=device,
                           dtype=getattr(torch, s.dtype)) for n, s in cache.states.items()}


def single_row(model: TorchModel, num_spec: int):
    """``forward_one(tokens, read, write)`` for ``hybrid_serving.generate``: one non-spec
    row through private pools of 3 blocks (``forward_one.pools``); logits as NumPy."""
    cache = model.cfg.cache_config(num_spec + 1, num_spec)  # (only its pool shapes)
    pools = new_pools(cache, 3, model.device)
    errors = torch.from_numpy(new_errors()).to(model.device)
    ids = lambda *v: torch.tensor(v, dtype=torch.int32, device=model.device)  # noqa: E731

    def forward_one(tokens, read: int, write: int) -> np.ndarray:
        blocks = Blocks(ids(read), ids(read), ids(0), ids([write] + [-1] * num_spec),
                         ids(write))
        lg = model.forward(pools, errors, ids(*tokens), ids(0, len(tokens)), blocks,
                           torch.tensor([False], device=model.device))
        raise_errors(errors.cpu().numpy())
        return lg.cpu().numpy()
    forward_one.pools = pools  # the state it left in each of its blocks
    return forward_one


class OnHost:
    """A device tensor that NumPy copies to the host when asked (``np.asarray``): a timing
    run that never looks at the logits does not move them."""

    def __init__(self, t: torch.Tensor):
        self.t = t

    def __array__(self, dtype=None, copy=None):
        if copy is False:  # NumPy 2's protocol: the values live on the device
            raise ValueError("the logits are on the device: reading them is a copy")
        return self.t.cpu().numpy() if dtype is None else self.t.cpu().numpy().astype(dtype)


def greedy_accept(logits: torch.Tensor, tokens: torch.Tensor, cu_seqlens: torch.Tensor,
                  is_spec: torch.Tensor, limit: torch.Tensor, num_spec: int) -> torch.Tensor:
    """Greedy sampling's token counts, int32 ``[rows]``: on a spec row 1 + the leading
    drafts the model's argmax agrees with, 1 on other rows, at most ``limit``
    (``StepInputs``). ``logits`` ``[T, vocab]``, ``tokens`` ``[T]``, ``cu_seqlens``
    ``[rows + 1]``; no host synchronisation (CUDA-graph capturable)."""
    top = logits.argmax(-1).to(torch.int32)
    j = torch.arange(num_spec, device=logits.device)
    start = cu_seqlens[:-1, None] + j  # position j of a row predicts its draft j + 1
    drafted = j[None, :] < (cu_seqlens[1:] - cu_seqlens[:-1] - 1)[:, None]
    at = torch.where(drafted, start, 0)
    agree = drafted & (top[at] == tokens[torch.where(drafted, start + 1, 0)])
    accepted = torch.cumprod(agree.to(torch.int32), 1).sum(1)
    ns = torch.where(is_spec, accepted + 1, torch.ones_like(accepted))
    return torch.minimum(ns, limit).to(torch.int32)


def serving_step(model: TorchModel, runner, pools: Mapping[str, torch.Tensor], *,
                 fused: bool = False, graphs: bool = False):
    """``step(inputs, sample)`` for ``hybrid_serving.serve``: the ``StateRunner``'s
    add_requests / preprocess, the model on the resolved blocks (faults into the runner's
    error flag), the post-process. Returns the logits (:class:`OnHost`) and the sampled
    counts (NumPy). By default the post-process takes ``sample()``, the reference
    sampler's counts; ``fused``: the counts come from :func:`greedy_accept` on the device,
    so nothing leaves the device mid-step; ``graphs`` (CUDA, implies ``fused``): each
    shape of the inputs is captured once into a CUDA graph and replayed."""
    dev = model.device
    num_spec = runner.config.num_spec
    graphs = graphs and dev.type == "cuda"
    on = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731  (int32 / bool as given)

    def body(x, ns=None):  # ns: the host's counts, else greedy_accept's
        runner.add_requests(x.added_slots, x.added_num_computed)
        blocks = runner.preprocess(pools, x.idx_mapping, x.query_len, x.is_spec,
                                   x.block_table)
        logits = model.forward(pools, runner.error_flag, x.tokens, x.cu_seqlens, blocks,
                               x.is_spec)
        if ns is None:
            ns = greedy_accept(logits, x.tokens, x.cu_seqlens, x.is_spec, x.limit, num_spec)
        runner.postprocess(pools, x.idx_mapping, x.query_len, x.is_spec, ns, x.block_table)
        return logits, ns

    captured = {}  # inputs' shapes -> (static inputs, graph, static outputs)

    def replay(inputs):
        key = tuple(a.shape for a in inputs)
        if key not in captured:
            # a step of padding rows only: every kernel compiles and nothing changes
            idle = inputs._replace(added_slots=np.full_like(inputs.added_slots, -1),
                                   idx_mapping=np.full_like(inputs.idx_mapping, -1),
                                   query_len=np.zeros_like(inputs.query_len),
                                   limit=np.zeros_like(inputs.limit),
                                   cu_seqlens=np.zeros_like(inputs.cu_seqlens))
            static = type(inputs)(*(on(a) for a in idle))
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                body(static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread-local: another thread's CUDA call (JAX's runtime, in a process that
            # also runs JAX) must not invalidate the capture, as the global mode lets it
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outs = body(static)
            captured[key] = (static, graph, outs)
        static, graph, outs = captured[key]
        for dst, a in zip(static, inputs):
            dst.copy_(torch.from_numpy(a), non_blocking=True)
        graph.replay()
        return outs

    def step(inputs, sample):
        if graphs:
            logits, ns = replay(inputs)
        else:
            x = type(inputs)(*(on(a) for a in inputs))
            logits, ns = body(x, None if fused else on(np.asarray(sample(), np.int32)))
        return OnHost(logits), ns.cpu().numpy()
    step.snapshot = lambda block: {n: to_numpy(p[:, block]) for n, p in pools.items()}
    step.errors = runner.errors  # read before the scheduler records the step's blocks
    step.graphs = captured
    return step
