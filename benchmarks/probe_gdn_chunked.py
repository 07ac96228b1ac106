"""One-off probe: the chunked gated delta rule (``algorithm="chunked"``) per tile, at
``bench_recurrent.py``'s shapes (H = 16, HV = 32, K = V = 128, bf16 q/k/v, fp32 state, given
gates, q/k l2norm), on prefill rows, against our token-by-token kernel and fla's
``chunk_gated_delta_rule`` in the same process.

A variant is ``CHUNK:BV:WARPS:PRECISION[:PREPARE_WARPS]`` (tokens per chunk, value columns
per program of the recurrence, its warps, ``tl.dot``'s input precision, the warps of step 1,
the solve); each runs in a process of its own (the precision is a global the kernel reads
when it compiles). Every output is checked against the float64 reference of the first row
before it is timed (CUDA-graph replay, cold blocks cycled), and its largest relative
difference from the token-by-token kernel's output is recorded. Step 1 (every chunk's
solve) is also timed alone (``chunked_step1``).
Writes ``probe_gdn_chunked_{label}_h200.json`` under ``--out`` (the card it ran on named
inside).

Usage::

    python benchmarks/probe_gdn_chunked.py --out DIR [--label L] [--tokens 2048]
        [--rows 1,8] [--variants 16:32:8:tf32x3,32:32:8:tf32x3,...] [--small] [--no-fla]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import bench_ms, constants, free  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from recurrent_cases import Case, check, load_fla, np32, shapes  # noqa: E402

DEFAULT_VARIANTS = ("16:32:8:tf32x3", "16:16:8:tf32x3", "16:64:8:tf32x3", "32:32:8:tf32x3",
                    "16:32:4:tf32x3",
                    "16:16:8:ieee", "32:32:4:tf32")


def run_variant(variant: str, tokens: int, rows: tuple, small: bool, no_fla: bool = False) -> list:
    """This process's rows for one variant (and the baselines at every row count)."""
    import triton.language as tl

    from mamba_align.backends.torch import ops as tops
    from mamba_align.kernels import recurrent
    chunk, bv, warps, precision, *rest = variant.split(":")
    prepare_warps = int(rest[0]) if rest else 4
    recurrent.DOT_PRECISION = tl.constexpr(precision)  # before the kernel first compiles
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    s = dict(shapes(small), prefill=tokens)
    fla = None if small or no_fla else load_fla()
    out = []
    for B in rows:  # a generator per row count: its inputs do not depend on --rows
        c = Case(s, B, tokens, False, dev, torch.Generator().manual_seed(B))
        g = (-torch.exp(c.A_log) * torch.nn.functional.softplus(c.a.float() + c.dt_bias))
        g = g.contiguous()
        beta = torch.sigmoid(c.b.float()).to(c.q.dtype)

        def ours(algorithm):
            return tops.gated_delta_rule_(c.pool, c.errors, c.q, c.k, c.v, g, beta, c.cu, c.rb,
                                          c.wbs, c.is_spec, layer=1, use_qk_l2norm=True,
                                          algorithm=algorithm)["o"]

        want = c.gdn_ref(0)[0]
        base = ours("recurrent")
        check(f"recurrent B={B}", base[:tokens], want, 5e-2)
        methods = {"recurrent": lambda: ours("recurrent")}
        from mamba_align.kernels import gdn_chunked
        warp_knobs = [n for n in ("NUM_WARPS", "FEW_PROGRAMS_WARPS") if hasattr(gdn_chunked, n)]
        with constants({"kernels.gdn_chunked.CHUNK": int(chunk),
                        "kernels.gdn_chunked.BV": int(bv),
                        **{f"kernels.gdn_chunked.{n}": int(warps) for n in warp_knobs},
                        "kernels.gdn_chunked.PREPARE_WARPS": prepare_warps}):
            got = ours("chunked")
            check(f"{variant} B={B}", got[:tokens], want, 5e-2)
            diff = float(np.max(np.abs(np32(got) - np32(base))) / np.max(np.abs(np32(base))))
            ms = bench_ms(lambda: ours("chunked"), dev.type == "cuda", graph=dev.type == "cuda")
            step1 = _step1(tops, dict(pool=c.pool, errors=c.errors, q=c.q, k=c.k, v=c.v, g=g,
                                      beta=beta, cu_seqlens=c.cu, read_block=c.rb,
                                      write_blocks=c.wbs, is_spec=c.is_spec), dev)
            ms1 = bench_ms(step1, dev.type == "cuda", graph=dev.type == "cuda")
        out.append(dict(variant=variant, method="chunked", rows=B, tokens_per_row=tokens,
                        us=ms * 1e3, rel_diff_from_recurrent=diff))
        out.append(dict(variant=variant, method="chunked_step1", rows=B,
                        tokens_per_row=tokens, us=ms1 * 1e3))
        if fla is not None:
            h0 = c.pool[1].index_select(0, c.rb).contiguous()
            kw = dict(q=c.q[None], k=c.k[None], v=c.v[None], g=g[None], beta=beta[None],
                      initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                      state_v_first=True, cu_seqlens=c.cu)
            of, _ = fla[1](**kw)
            check(f"fla chunk B={B}", of[0, :tokens], want, 5e-2)
            methods["fla_chunk"] = lambda kw=kw: fla[1](**kw)
        for name, fn in methods.items():
            ms = bench_ms(fn, dev.type == "cuda", graph=dev.type == "cuda")
            out.append(dict(variant=variant, method=name, rows=B, tokens_per_row=tokens,
                            us=ms * 1e3))
        c.assert_clean(f"B={B}")
        del c
        free(dev.type == "cuda")
    return out


def _step1(tops, arrays: dict, dev: torch.device):
    """A function that launches the chunked plan's step 1 alone, on scratch it allocates
    once."""
    from mamba_align import kernels as K
    plan = tops._plan(K.GATED_DELTA_RULE, arrays, dict(layer=1, scale=0.0, use_qk_l2norm=True,
                                                       layout="VK", algorithm="chunked"))
    stage = plan.before[0]
    args = dict(arrays, **{n: torch.empty(o.shape, dtype=torch.float32, device=dev)
                           for n, o in stage.out_specs.items()})
    return lambda: tops._run(stage, dict(args), dev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="current")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rows", default="1,8", help="prefill rows per launch, comma-separated")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    ap.add_argument("--small", action="store_true", help="CPU smoke run: tiny shapes")
    ap.add_argument("--no-fla", action="store_true", help="leave fla's kernel out")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one variant
    args = ap.parse_args()
    rows = tuple(int(r) for r in args.rows.split(","))
    if args.one:
        print(json.dumps(run_variant(args.one, args.tokens, rows, args.small, args.no_fla)))
        return
    records = []
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, "--out", args.out, "--tokens", str(args.tokens),
               "--rows", args.rows, "--one", variant] + (["--small"] if args.small else []) \
            + (["--no-fla"] if args.no_fla else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(f"{variant}: failed\n{r.stderr[-2000:]}", flush=True)
            records.append(dict(variant=variant, failed=r.stderr[-2000:]))
            continue
        for rec in json.loads(r.stdout.strip().splitlines()[-1]):
            print(json.dumps(rec), flush=True)
            records.append(rec)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    (out / f"probe_gdn_chunked_{args.label}_h200.json").write_text(json.dumps(
        dict(label=args.label, device=device, tokens=args.tokens, records=records), indent=1))


if __name__ == "__main__":
    main()
