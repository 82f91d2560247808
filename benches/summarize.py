#!/usr/bin/env python3
"""Prints one line per criterion benchmark (median time and throughput) from its output."""
import re
import sys

text = open(sys.argv[1]).read()
pat = r'^(\S+)\s*\n?\s*time:\s+\[\S+ \S+ (\S+ \S+) \S+ \S+\]\s*\n\s*thrpt:\s+\[\S+ \S+ (\S+ \S+)'
for m in re.finditer(pat, text, re.M):
    print(f"{m.group(1):34} {m.group(2):>12} {m.group(3):>14}")
