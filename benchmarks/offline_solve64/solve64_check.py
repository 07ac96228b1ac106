"""Accuracy of proto.step1_kernel (Triton's interpreter, with mamba_align.kernels' patch that
cuts fp32 dot inputs to TF32 as the GPU does; sums stay float64) against a float64 NumPy
reference of W and U0, per SOLVE x PREC at C = 64, plus our kernel's step 1
(gdn_chunk_prepare_kernel, C = 16) and the prototype at C = 16 on the same inputs.

Run:  cd /tmp/solve64 && /work/main/.venv/bin/python check.py > check.txt
Metric per (chunk, head): max |out - ref| / max |ref| over the chunk's rows and columns;
printed: the max over heads per chunk case, and over all.
"""
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import mamba_align.kernels  # noqa: E402,F401  (installs the interpreter's TF32 emulation)
from mamba_align.kernels.gdn_chunked import gdn_chunk_prepare_kernel  # noqa: E402
import proto  # noqa: E402

T, H, HV, K, V = 304, 1, 2, 128, 128  # five 64-token chunks, the last one 48 tokens
CASES = ["typical", "strong decay", "correlated k", "near-duplicate k", "tail (48 tok)"]


def softplus(x):
    return np.log1p(np.exp(x))


def make_inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, H, K))
    k = rng.standard_normal((T, H, K))
    # chunk 2: correlated keys (k . k' ~ 0.9)
    base = rng.standard_normal((1, H, K))
    k[128:192] = base + 0.35 * rng.standard_normal((64, H, K))
    # chunk 3: near-duplicate keys (k . k' ~ 0.99), beta ~ 0.98, almost no decay
    base = rng.standard_normal((1, H, K))
    k[192:256] = base + 0.1 * rng.standard_normal((64, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    v = rng.standard_normal((T, HV, V))
    A = np.exp(rng.uniform(-1, 1, HV))  # decay rate per head
    a = rng.normal(-2.0, 1.5, (T, HV))
    a[64:128] = rng.normal(2.0, 1.0, (64, HV))  # chunk 1: strong decay (g ~ -1 .. -8)
    a[128:192] = rng.normal(-5.0, 1.0, (64, HV))  # chunk 2: weak decay
    a[192:256] = rng.normal(-7.0, 1.0, (64, HV))  # chunk 3: very weak decay
    g = -A * softplus(a)
    b = rng.normal(0.0, 1.5, (T, HV))
    b[128:192] = rng.normal(2.5, 0.5, (64, HV))  # chunk 2: beta near 1
    b[192:256] = rng.normal(4.0, 0.5, (64, HV))  # chunk 3: beta ~ 0.98
    beta = 1 / (1 + np.exp(-b))
    tq = torch.tensor(q, dtype=torch.bfloat16)
    tk = torch.tensor(k, dtype=torch.bfloat16)
    tv = torch.tensor(v, dtype=torch.bfloat16)
    tg = torch.tensor(g, dtype=torch.float32)
    tb = torch.tensor(beta, dtype=torch.float32)
    return tq, tk, tv, tg, tb


def reference(tk, tv, tg, tb, C, l2norm):
    """float64 W, U0 [T, HV, K/V] for chunks of C tokens."""
    k = tk.double().numpy()
    if l2norm:
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    v, g, beta = tv.double().numpy(), tg.double().numpy(), tb.double().numpy()
    W, U = np.zeros((T, HV, K)), np.zeros((T, HV, V))
    for c0 in range(0, T, C):
        sl = slice(c0, min(T, c0 + C))
        n = sl.stop - c0
        for h in range(HV):
            kc, bc = k[sl, h // (HV // H)], beta[sl, h]
            G = np.cumsum(g[sl, h])
            M = np.tril(bc[:, None] * (kc @ kc.T) * np.exp(G[:, None] - G[None, :]), -1)
            N = np.eye(n) + M
            W[sl, h] = np.linalg.solve(N, bc[:, None] * np.exp(G)[:, None] * kc)
            U[sl, h] = np.linalg.solve(N, bc[:, None] * v[sl, h])
    return W, U


def conditioning(tk, tg, tb, C):
    """per 64-token case: max over heads and C-chunks of cond_inf(I + M) and max |(I+M)^-1|."""
    k = tk.double().numpy()
    g, beta = tg.double().numpy(), tb.double().numpy()
    out = []
    for c0 in range(0, T, 64):
        cond = big = 0.0
        for s in range(c0, min(T, c0 + 64), C):
            sl = slice(s, min(T, s + C))
            for h in range(HV):
                kc, bc = k[sl, h // (HV // H)], beta[sl, h]
                G = np.cumsum(g[sl, h])
                N = np.eye(len(bc)) + np.tril(bc[:, None] * (kc @ kc.T)
                                              * np.exp(G[:, None] - G[None, :]), -1)
                Ni = np.linalg.inv(N)
                cond = max(cond, np.abs(N).sum(1).max() * np.abs(Ni).sum(1).max())
                big = max(big, np.abs(Ni).max())
        out.append((cond, big))
    return out


def errors(out, ref, C):
    """per 64-token case: max over heads and the case's C-chunks of max|err| / max|ref|."""
    res = []
    for c0 in range(0, T, 64):
        worst = 0.0
        for s in range(c0, min(T, c0 + 64), C):
            sl = slice(s, min(T, s + C))
            for h in range(HV):
                r = ref[sl, h]
                e = np.abs(out[sl, h].astype(np.float64) - r).max() / np.abs(r).max()
                worst = max(worst, e)
        res.append(worst)
    return res


def run_proto(inp, C, solve, prec, l2norm, extras=False, variant=None):
    tq, tk, tv, tg, tb = inp
    w = torch.zeros((T, HV, K), dtype=torch.float32)
    u = torch.zeros((T, HV, V), dtype=torch.float32)
    cg = torch.zeros((T, HV), dtype=torch.float32)
    cq = torch.zeros((T, HV, K), dtype=torch.float32)
    ck = torch.zeros((T, HV, K), dtype=torch.float32)
    ca = torch.zeros((T, HV, C), dtype=torch.float32)
    grid = ((T + C - 1) // C, HV)
    if variant == "halves":
        proto.step1_halves_kernel[grid](tq, tk, tv, tg, tb, w, u, cg, cq, ck, ca, T, 0.5, H=H,
                                        HV=HV, K=K, V=V, C=C, SOLVE=solve, PREC=prec,
                                        L2NORM=l2norm, EXTRAS=extras)
    else:
        proto.step1_kernel[grid](tq, tk, tv, tg, tb, w, u, cg, cq, ck, ca, T, 0.5, H=H, HV=HV,
                                 K=K, V=V, C=C, SOLVE=solve, PREC=prec, L2NORM=l2norm,
                                 EXTRAS=extras, TRANS=variant == "trans")
    return w.numpy(), u.numpy(), (cg, cq, ck, ca)


def run_ours(inp, l2norm):
    """Our step 1 (C = 16) as the plan launches it, one row."""
    tq, tk, tv, tg, tb = inp
    split = 16
    cu = torch.tensor([0, T], dtype=torch.int64)
    outs = dict(chunk_g=torch.zeros((T, HV)), chunk_w=torch.zeros((T, HV, K)),
                chunk_u=torch.zeros((T, HV, V)), chunk_q=torch.zeros((T, HV, K)),
                chunk_k=torch.zeros((T, HV, K)), chunk_a=torch.zeros((T, HV, 16)))
    gdn_chunk_prepare_kernel[(HV * split,)](
        tq, tk, tv, tg, tb, cu, T, H * K, K, HV * V, V, HV, 0.5, outs["chunk_g"],
        outs["chunk_w"], outs["chunk_u"], outs["chunk_q"], outs["chunk_k"], outs["chunk_a"],
        K=K, V=V, BK=K, BVF=V, L2NORM=l2norm, QK_ALIGN=1, V_ALIGN=1, HV=HV, GROUP=HV // H,
        CHUNK=16, SPLIT=split)
    return outs["chunk_w"].numpy(), outs["chunk_u"].numpy()


def fmt(xs):
    return " ".join(f"{x:9.2e}" for x in xs)


def main():
    inp = make_inputs()
    print(f"T {T} (chunks: {', '.join(CASES)}), H {H}, HV {HV}, K {K}, V {V}; q/k/v bf16, "
          f"g/beta fp32; metric max|err|/max|ref| per (chunk, head), max over heads")
    for C in (16, 64):
        print(f"C={C}: cond_inf(I+M), max|(I+M)^-1| per case: " + ", ".join(
            f"{c:.1f} / {b:.1f}" for c, b in conditioning(inp[1], inp[3], inp[4], C)))
    print(f"{'variant':34s} {'W per case':>50s} | {'U0 per case':>50s} | max W, max U0")
    for l2norm in (True, False):
        ref64 = reference(inp[1], inp[2], inp[3], inp[4], 64, l2norm)
        ref16 = reference(inp[1], inp[2], inp[3], inp[4], 16, l2norm)
        print(f"-- L2NORM {l2norm}")
        rows = [("ours C=16 (gdn_chunk_prepare)", None, None, 16, None)]
        rows += [(f"proto C=16 fwd {p}", "fwd", p, 16, None) for p in ("tf32x3", "3x")]
        for solve in ("fwd", "bd_horner", "bd_fact", "bd_rhs", "blk", "blk_rhs"):
            for p in ("tf32x3", "3x"):
                rows.append((f"C=64 {solve} {p}", solve, p, 64, None))
        for p in ("tf32x3", "3x"):
            rows.append((f"C=64 bd_horner {p} TRANS", "bd_horner", p, 64, "trans"))
            for solve in ("bd_horner", "bd_fact"):
                rows.append((f"C=64 halves {solve} {p}", solve, p, 64, "halves"))
        if l2norm:
            rows += [("C=64 bd_horner ieee", "bd_horner", "ieee", 64, None),
                     ("C=64 bd_horner tf32 (1 pass)", "bd_horner", "tf32", 64, None),
                     ("C=64 blk tf32 (1 pass)", "blk", "tf32", 64, None)]
        for label, solve, prec, C, variant in rows:
            t0 = time.time()
            if solve is None:
                w, u = run_ours(inp, l2norm)
            else:
                w, u, _ = run_proto(inp, C, solve, prec, l2norm, variant=variant)
            ref = ref16 if C == 16 else ref64
            ew, eu = errors(w, ref[0], C), errors(u, ref[1], C)
            print(f"{label:34s} {fmt(ew)} | {fmt(eu)} | {max(ew):.2e} {max(eu):.2e} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    # the extras: against float64 of the same formulas (one variant)
    for variant in (None, "halves"):
        check_extras(inp, variant)


def check_extras(inp, variant):
    tq, tk, tv, tg, tb = inp
    w, u, (cg, cq, ck, ca) = run_proto(inp, 64, "bd_horner", "3x", True, extras=True,
                                       variant=variant)
    qn = tq.double().numpy()
    qn = qn / np.sqrt((qn * qn).sum(-1, keepdims=True) + 1e-6) * 0.5
    kn = tk.double().numpy()
    kn = kn / np.sqrt((kn * kn).sum(-1, keepdims=True) + 1e-6)
    g = tg.double().numpy()
    ea = eq = ek = 0.0
    for c0 in range(0, T, 64):
        sl = slice(c0, min(T, c0 + 64))
        n = sl.stop - c0
        for h in range(HV):
            G = np.cumsum(g[sl, h])
            D = np.tril(np.exp(G[:, None] - G[None, :]))
            a = (qn[sl, 0] @ kn[sl, 0].T) * D
            ea = max(ea, np.abs(ca[sl, h, :n].numpy() - a).max() / np.abs(a).max())
            qq = qn[sl, 0] * np.exp(G)[:, None]
            eq = max(eq, np.abs(cq[sl, h].numpy() - qq).max() / np.abs(qq).max())
            kd = kn[sl, 0] * np.exp(G[-1] - G)[:, None]  # (g = 0 past the row)
            ek = max(ek, np.abs(ck[sl, h].numpy() - kd).max() / np.abs(kd).max())
    ref = reference(tk, tv, tg, tb, 64, True)
    ew, eu = max(errors(w, ref[0], 64)), max(errors(u, ref[1], 64))
    print(f"extras ({variant or 'step1_kernel'} bd_horner 3x, L2NORM): W {ew:.2e}, U0 {eu:.2e}, chunk_a {ea:.2e}, chunk_q {eq:.2e}, "
          f"chunk_k {ek:.2e}, chunk_g exact {bool((cg == tg).all())}")


if __name__ == "__main__":
    main()
