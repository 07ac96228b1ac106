import collections
import re
import sys
sys.path.insert(0, "/work/main/benchmarks")
from ptxas_regs import _SASS_LINE


OPS = {"HMMA": r"^HMMA", "HGMMA": r"^HGMMA", "LDG": r"^LDG(?!STS)", "STG": r"^STG",
       "LDGSTS": r"^LDGSTS", "LDS": r"^LDS(?!M)", "LDSM": r"^LDSM", "STS": r"^STS",
       "BAR": r"^BAR", "LDL": r"^LDL", "STL": r"^STL", "MUFU": r"^MUFU"}


def opcodes(lines):
    c = collections.Counter()
    for text in lines:
        op = re.sub(r"^@!?U?P\w+\s+", "", text.strip()).split(" ")[0]
        for k, pat in OPS.items():
            if re.match(pat, op):
                c[k] += 1
    return c


def code_lines(sass):
    return [m.group(2) for m in map(_SASS_LINE.match, sass.splitlines()) if m]


def trip_lines(sass):
    """The instructions of the longest loop (as loop_trip finds it)."""
    code = [(int(m.group(1), 16), m.group(2)) for m in map(_SASS_LINE.match, sass.splitlines())
            if m]
    where = {a: i for i, (a, _) in enumerate(code)}
    loops = []
    for i, (a, text) in enumerate(code):
        t = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if t and int(t.group(1), 16) < a and int(t.group(1), 16) in where:
            loops.append((where[int(t.group(1), 16)], i))
    if not loops:
        return [], []
    lo, hi = max(loops, key=lambda x: x[1] - x[0])
    return [t for _, t in code[lo:hi + 1]], loops


def fmt(c):
    return " ".join(f"{k} {c[k]}" for k in OPS if c[k])


