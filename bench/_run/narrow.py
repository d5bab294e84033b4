"""Narrow a copy of the shipped builds folder to three builds for the capped campaign: python narrow.py BUILDS_DIR"""
import re
import sys
from pathlib import Path

d = Path(sys.argv[1])
p = d / "release.yaml"
t = p.read_text()
names = "[rtn, sq_auto, sq_auto_gptq]"
t, n1 = re.subn(r"^sweep: \[.*?\]", f"sweep: {names}", t, count=1, flags=re.S | re.M)
t, n2 = re.subn(r"^  candidates: \[.*?\]", f"  candidates: {names}", t, count=1, flags=re.S | re.M)
t, n3 = re.subn(r"^  count: 2$", "  count: 1", t, count=1, flags=re.M)
t, n4 = re.subn(r"^campaign:\n  evals:\n.*?(?=^  yardsticks:)",
                "campaign:\n  evals:\n    - {path: fakequant, split: validation}\n"
                "    - {path: deployed, split: validation, builds: [rtn]}\n", t, count=1, flags=re.S | re.M)
t, n5 = re.subn(r"^  yardsticks: \[calibration, validation\]$", "  yardsticks: []", t, count=1, flags=re.M)
assert (n1, n2, n3, n4, n5) == (1, 1, 1, 1, 1), (n1, n2, n3, n4, n5)
p.write_text(t)
for b in ("rtn", "sq_auto", "sq_auto_gptq"):
    q = d / f"{b}.yaml"
    s = q.read_text()
    s, m1 = re.subn(r"^calibration_calls: 256$", "calibration_calls: 64", s, flags=re.M)
    s, m2 = re.subn(r"^algorithm_calls: 32$", "algorithm_calls: 8", s, flags=re.M)
    assert (m1, m2) == (1, 1), (b, m1, m2)
    q.write_text(s)
print("narrowed", d)
