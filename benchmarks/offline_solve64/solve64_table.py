"""compile_sass.txt as a table: per variant registers, spills, shared memory, programs an SM
(registers: 64 K a SM, allocated 8 a thread at a time; shared memory: 228 KiB a SM, 1 KiB
reserved a program), instructions a warp per 64-token chunk and per 16 tokens, all warps of
a program per 16 tokens, the substitution loop, MMA counts.

Run:  cd /tmp/solve64 && /work/main/.venv/bin/python table.py [compile_sass.txt] > table.txt
"""
import re
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/solve64/compile_sass.txt"
rows = []
for line in open(path):
    m = re.match(r"(\S+)\s+(\d+) registers, spill stores (\d+) B, loads (\d+) B; smem (\d+) B;",
                 line)
    if not m:
        continue
    tag = m.group(1)
    regs, st, ld, smem = map(int, m.group(2, 3, 4, 5))
    warps = int(re.search(r"_w(\d+)", tag).group(1))
    per16 = int(re.search(r"per 16 tokens (\d+) a warp", line).group(1))
    if tag.startswith("ours"):
        mm = re.search(r"a chunk (\d+) = (\d+) \+ (\d+) x (\d+)", line)
        chunk, sub, trips = int(mm.group(1)), int(mm.group(3)), int(mm.group(4))
        tokens = 16
        ops = re.search(r"chunk loop \[([^\]]*)\]", line).group(1)
    else:
        mm = re.search(r"a chunk (\d+) = (\d+) \+ (\d+) x (\d+)", line)
        chunk, sub, trips = int(mm.group(1)), int(mm.group(3)), int(mm.group(4))
        tokens = 64
        ops = re.search(r"kernel \[([^\]]*)\]", line).group(1)
    hmma = re.search(r"\bHMMA (\d+)", ops)
    hgmma = re.search(r"HGMMA (\d+)", ops)
    by_regs = 65536 // (((regs + 7) // 8 * 8) * 32 * warps)
    by_smem = (228 * 1024) // (smem + 1024)
    rows.append((tag, warps, regs, st, ld, smem // 1024, min(by_regs, by_smem, 64 // warps),
                 tokens, chunk, sub, trips, per16, per16 * warps,
                 int(hmma.group(1)) if hmma else 0, int(hgmma.group(1)) if hgmma else 0))

hdr = ("variant", "warps", "regs", "spill st/ld B", "smem KiB", "prog/SM", "chunk tok",
       "instr/warp a chunk", "subst loop x trips", "per 16 tok a warp", "per 16 tok a program",
       "HMMA", "HGMMA")
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for (tag, warps, regs, st, ld, smem, prog, tokens, chunk, sub, trips, per16, perprog, hmma,
     hgmma) in sorted(rows, key=lambda r: (r[0].endswith("extras"), r[12])):
    print(f"| {tag} | {warps} | {regs} | {st}/{ld} | {smem} | {prog} | {tokens} | {chunk} | "
          f"{sub} x {trips} | {per16} | {perprog} | {hmma} | {hgmma} |")
print("\n(ours: the chunk loop of gdn_chunk_prepare_fused_gates_kernel, one 16-token chunk a "
      "trip, with its nested substitution loop counted x 15; it always writes the extras; "
      "MMA counts: static, the chunk loop for ours, the whole kernel for the prototypes)")
