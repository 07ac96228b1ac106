"""Probe (not committed): whole-step CUDA-graph time per launch-shape variant."""
import json, os, subprocess, sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "b32c32": {}, "b16c64": {"ROWS_PER_PROGRAM": 16, "DUP_CHUNK": 64},
    "b8c128": {"ROWS_PER_PROGRAM": 8, "DUP_CHUNK": 128},
    "b8c64": {"ROWS_PER_PROGRAM": 8, "DUP_CHUNK": 64},
    "b16c32": {"ROWS_PER_PROGRAM": 16, "DUP_CHUNK": 32},
    "b8c128w2": {"ROWS_PER_PROGRAM": 8, "DUP_CHUNK": 128, "ROW_WARPS": 2},
    "b8c128loop": {"ROWS_PER_PROGRAM": 8, "DUP_CHUNK": 128, "DUP_UNROLL": 128},
    "b4c256": {"ROWS_PER_PROGRAM": 4, "DUP_CHUNK": 256},
    "nodup": {}, "nodup_b8": {"ROWS_PER_PROGRAM": 8}, "baseline": None}

def child(name, rows):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_dispatch as bd
    import triton
    from mamba_align.kernels import bookkeeping, resolve
    if VARIANTS[name]:
        for k, v in VARIANTS[name].items():
            setattr(bookkeeping, k, v)
    if name.startswith("nodup"):
        sys.path.insert(0, str(ROOT / "probe"))
        from nodup import nodup
        resolve.duplicated = nodup
        bookkeeping.duplicated = nodup
    s = bd.setup(False, rows)
    timer = dict(reps=7, n0=50, min_s=0.2)
    ms, _ = bd.run_torch(s, True, timer)
    print(json.dumps({"variant": name, "rows": rows, "graph_us": ms["torch_graph"][0] * 1e3}))

if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(sys.argv[1], int(sys.argv[2])); sys.exit()
    out = []
    for rows in (64, 512):
        for name in VARIANTS:
            env = dict(os.environ)
            if name == "baseline":
                env["PYTHONPATH"] = str(ROOT / ".baseline") + ":" + env.get("PYTHONPATH", "")
            for rep in range(1):
                r = subprocess.run([sys.executable, __file__, name, str(rows)], env=env,
                                   capture_output=True, text=True)
                line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]
                print(line, flush=True)
                try: out.append(json.loads(line))
                except Exception: pass
    Path(os.environ.get("OUT", "."), "rows_probe.json").write_text(json.dumps(out, indent=1))
