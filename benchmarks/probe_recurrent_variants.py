"""One-off probe: our gated delta rule and conv update against fla alone at decode and spec
rows (B = 1, 64, 256), the bench_recurrent cases and timer; run once per kernel variant
(copy the variant over kernels/gdn.py first). Prints one JSON line."""

from __future__ import annotations

import json
import sys

import torch

from bench_copy import bench_ms
from bench_recurrent import Case, load_fla, shapes, state_bytes


def main(label: str) -> None:
    fused, _, conv_update = load_fla()
    s = shapes(False)
    gen = torch.Generator().manual_seed(0)
    out = {"label": label, "rows": []}
    for T, spec in ((1, False), (4, True)):
        for B in (1, 64, 256):
            c = Case(s, B, T, spec, torch.device("cuda"), gen)
            r = {"B": B, "T": T}
            r["gdn_us"] = 1e3 * bench_ms(c.timed(c.gdn), True, graph=True)
            r["gdn_tbps"] = state_bytes(s, B, T if spec else 1) / (r["gdn_us"] * 1e-6) / 1e12
            if not spec:
                r["conv_us"] = 1e3 * bench_ms(c.timed(c.conv), True, graph=True)
                h0s = [c.pool[1].index_select(0, rb).contiguous() for rb, _, _ in c.sets]
                fla = lambda: fused(q=c.q[None], k=c.k[None], v=c.v[None], g=c.a[None],  # noqa
                                    beta=c.b[None], initial_state=h0s[c.i % c.nsets],
                                    output_final_state=True, use_qk_l2norm_in_kernel=True,
                                    use_gate_in_kernel=True, A_log=c.A_log, dt_bias=c.dt_bias,
                                    use_beta_sigmoid_in_kernel=True, state_v_first=True,
                                    cu_seqlens=c.cu)
                r["fla_gdn_us"] = 1e3 * bench_ms(c.timed(fla), True, graph=True)
                caches = [torch.zeros(B, s["D"], s["KC"], device="cuda", dtype=torch.bfloat16)
                          for _ in c.csets]
                cv = lambda: conv_update(x=c.x, cache=caches[c.i % c.cnsets], weight=c.w,  # noqa
                                         bias=None, activation="silu")
                r["fla_conv_us"] = 1e3 * bench_ms(c.timed(cv), True, graph=True)
                del h0s, caches
            c.assert_clean(label)
            out["rows"].append(r)
            print(r, file=sys.stderr, flush=True)
            del c
            torch.cuda.empty_cache()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
