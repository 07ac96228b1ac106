"""Check proto.chain64_kernel's arithmetic on the CPU (Triton's interpreter) against a NumPy
float64 reference of the same recurrence, per precision variant.

Run:  cd /tmp/chain64 && /work/main/.venv/bin/python check.py
The interpreter ignores ``input_precision``; importing mamba_align.kernels (read-only)
installs /work/main/kernels/interpret.py's patch, which cuts fp32 dot inputs as the GPU does
(TF32: truncated; Triton's TF32x3: nearest TF32 + truncated remainder, remainders' product
dropped) but sums in float64, so the errors below are the input cuts' and fp32 storage's,
not the GPU's fp32 summation order.
"""
import itertools
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, "/work")  # for `import mamba_align` (the package is /work/main)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import mamba_align.kernels  # noqa: E402,F401  (installs the interpreter's TF32 emulation)
import proto  # noqa: E402

T, HV, K, V, BT = 256, 2, 128, 128, 64
NT = T // BT


def make_inputs(seed=0):
    """A real gated delta rule's chunk inputs (float64): unit k, beta in (0.3, 1), log decays
    in (-0.1, -0.01); per chunk W, U by the unit lower triangular solve, kd, g_last; plus a
    token-by-token final state to check the chunk form itself."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((T, HV, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, HV, V))
    beta = rng.uniform(0.3, 1.0, (T, HV))
    g = -rng.uniform(0.01, 0.1, (T, HV))
    h0 = rng.standard_normal((HV, K, V)) * 0.5
    w, u, kd = np.zeros((T, HV, K)), np.zeros((T, HV, V)), np.zeros((T, HV, K))
    gl = np.zeros((NT, HV))
    for c in range(NT):
        sl = slice(c * BT, (c + 1) * BT)
        for h in range(HV):
            kc, vc, bc = k[sl, h], v[sl, h], beta[sl, h]
            G = np.cumsum(g[sl, h])
            M = np.tril(bc[:, None] * (kc @ kc.T) * np.exp(G[:, None] - G[None, :]), -1)
            A = np.linalg.inv(np.eye(BT) + M)
            w[sl, h] = A @ (bc[:, None] * np.exp(G)[:, None] * kc)
            u[sl, h] = A @ (bc[:, None] * vc)
            kd[sl, h] = kc * np.exp(G[-1] - G)[:, None]
            gl[c, h] = G[-1]
    S = h0.copy()  # token by token: S = e^g S + beta k (v - e^g k^T S)
    for t in range(T):
        S = np.exp(g[t])[:, None, None] * S
        err = v[t] - np.einsum("hk,hkv->hv", k[t], S)
        S = S + np.einsum("hk,hv->hkv", k[t], beta[t][:, None] * err)
    return w, u, kd, gl, h0, S


def reference(w, u, kd, gl, h0):
    """The chain in float64: h per chunk (before its update), v_new, the final state."""
    S = h0.copy()
    hs, vn = np.zeros((NT, HV, K, V)), np.zeros((T, HV, V))
    for c in range(NT):
        sl = slice(c * BT, (c + 1) * BT)
        hs[c] = S
        for h in range(HV):
            vn[sl, h] = u[sl, h] - w[sl, h] @ S[h]
            S[h] = np.exp(gl[c, h]) * S[h] + kd[sl, h].T @ vn[sl, h]
    return hs, vn, S


def split_fp32(x, rna):
    """fp32 ``x`` as ``big + small`` exactly, as proto._split does it."""
    b = x.view(np.int32)
    big = (((b + 0x1000) if rna else b) & -8192).view(np.float32)
    return big, (x - big).astype(np.float32)


def run(inp32, bv, split, prec, vk, rna, presplit):
    w, u, kd, gl, h0 = inp32
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    wlo = kdlo = np.zeros(1, np.float32)
    if presplit:
        w, wlo = split_fp32(w, rna)
        kd, kdlo = split_fp32(kd, rna)
    h0k = h0.transpose(0, 2, 1) if vk else h0
    hs = torch.zeros((NT, HV, V, K) if vk else (NT, HV, K, V))
    vn = torch.zeros((T, HV, V))
    ht = torch.zeros((HV, V, K) if vk else (HV, K, V))
    proto.chain64_kernel[(V // bv, HV)](
        t(w), t(u), t(kd), t(gl), t(h0k), hs, vn, ht, T, t(wlo), t(kdlo),
        HV=HV, K=K, V=V, BT=BT, BV=bv, SPLIT=split, PREC=prec, VK=vk, RNA=rna,
        PRESPLIT=presplit)
    hs, vn, ht = hs.numpy(), vn.numpy(), ht.numpy()
    if vk:
        hs, ht = hs.transpose(0, 1, 3, 2), ht.transpose(0, 2, 1)
    return hs, vn, ht


def rel(x, ref):
    return float(np.max(np.abs(x - ref)) / np.max(np.abs(ref)))


def main():
    w, u, kd, gl, h0, S_tok = make_inputs()
    inp32 = [a.astype(np.float32) for a in (w, u, kd, gl, h0)]
    ref = reference(*[a.astype(np.float64) for a in inp32])
    print(f"T {T}, HV {HV}, K {K}, V {V}, BT {BT}; float64 chunk form vs token by token: "
          f"final state rel err {rel(reference(w, u, kd, gl, h0)[2], S_tok):.1e}")
    print("error = max |x - ref| / max |ref| per output (ref: float64 recurrence of the same "
          "fp32 inputs)")
    cases = [(32, 1, p, False, True, False) for p in ("ieee", "tf32", "tf32x3")]
    cases += [(32, 1, "3x", False, True, False), (32, 1, "3x", False, False, False),
              (32, 1, "3x", False, True, True),
              (32, 1, "3x", False, False, True)]
    cases += [(bv, sp, "tf32x3", vk, True, False)
              for bv, sp, vk in itertools.product((32, 64), (1, 2), (False, True))
              if (bv, sp, vk) != (32, 1, False)]
    cases += [(64, 2, "3x", False, True, True), (32, 2, "3x", True, True, True),
              (32, 2, "3x", True, False, False)]
    for bv, split, prec, vk, rna, presplit in cases:
        hs, vn, ht = run(inp32, bv, split, prec, vk, rna, presplit)
        name = (f"BV {bv} SPLIT {split} {prec}" + (" VK" if vk else "")
                + ((" rna" if rna else " trunc") + (" presplit" if presplit else "")
                   if prec == "3x" else ""))
        print(f"  {name:38s} h {rel(hs, ref[0]):.2e}  v_new {rel(vn, ref[1]):.2e}  "
              f"final {rel(ht, ref[2]):.2e}", flush=True)


if __name__ == "__main__":
    main()
