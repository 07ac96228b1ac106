"""Summarise compile_sass.txt: every variant sorted by warp-instructions per 16 tokens per
32 value columns (a BV = 32 program's work), smem over the 227 KiB a block can have marked.
Run: /work/main/.venv/bin/python table.py > table.txt"""
import re
SMEM_MAX = 232448  # 227 KiB: the most dynamic shared memory an H100 / H200 block can have
rows = []
for line in open("/tmp/chain64/compile_sass.txt"):
    m = re.match(r"(\S+)\s+(\d+) registers, spill stores (\d+) B, loads (\d+) B; smem (\d+) B;"
                 r" programs (\d+); trip (\d+).*?per 16 tok: (\d+) a warp, (\d+) a program, "
                 r"(\d+) per 32 cols.*\[(.*)\]", line)
    if m:
        rows.append(m.groups())
rows.sort(key=lambda r: (int(r[4]) > SMEM_MAX, int(r[9])))
print(f"{'variant':40s} {'regs':>4} {'spill st/ld':>11} {'smem':>7} {'trip':>5} "
      f"{'/16tok/warp':>11} {'/16tok/prog':>11} {'/16tok/32col':>12}  trip opcodes")
for r in rows:
    flag = " TOO MUCH SMEM" if int(r[4]) > SMEM_MAX else ""
    print(f"{r[0]:40s} {r[1]:>4} {r[2] + '/' + r[3]:>11} {int(r[4]) // 1024:>6}K {r[6]:>5} "
          f"{r[7]:>11} {r[8]:>11} {r[9]:>12}  [{r[10]}]{flag}")
