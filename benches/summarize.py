#!/usr/bin/env python3
"""Prints one line per criterion benchmark (median time and throughput) from its output."""
import re
import sys

text = open(sys.argv[1]).read()
# Criterion pads numbers inside the brackets ("[ 29348 Gelem/s ...").
pat = r'^(\S+)\s*\n?\s*time:\s+\[\s*\S+ \S+\s+(\S+ \S+)\s+\S+ \S+\]\s*\n\s*thrpt:\s+\[\s*\S+ \S+\s+(\S+ \S+)'
for m in re.finditer(pat, text, re.M):
    print(f"{m.group(1):34} {m.group(2):>12} {m.group(3):>14}")
