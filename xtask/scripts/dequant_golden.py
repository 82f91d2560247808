#!/usr/bin/env python3
"""Golden statistics of gguf-py's dequantization of real tensors.

Writes, for one tensor of each dtype in the given GGUF, the sum, sum of squares and largest
magnitude of the whole dequantized tensor plus 64 values at fixed indices; no weights beyond
those samples are stored. The Rust test `dequant_matches_gguf_py` compares against it.

    python3 -m pip install gguf==0.19.0 numpy
    python3 xtask/scripts/dequant_golden.py MODEL.gguf > crates/gguf/tests/golden/gemma3_270m_dequant.json
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main(path):
    reader = GGUFReader(path)
    seen = {}
    for t in reader.tensors:
        name = t.tensor_type.name
        # One tensor per dtype, plus every dtype's first two: different layers, different data.
        if seen.get(name, 0) >= 2:
            continue
        seen[name] = seen.get(name, 0) + 1
        x = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
        n = x.size
        idx = sorted({int(i) for i in np.linspace(0, n - 1, 64)} | {1, 2, 3, 31, 32, 33, 255, 256})
        idx = [i for i in idx if i < n]
        print(f"{t.name} {name} n={n}", file=sys.stderr)
        yield {
            "name": t.name,
            "dtype": name,
            "elements": n,
            "sum": float(x.sum()),
            "sum_sq": float((x * x).sum()),
            "absmax": float(np.abs(x).max()),
            "samples": [[i, float(x[i])] for i in idx],
        }


if __name__ == "__main__":
    json.dump({"model_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
               "tool": "gguf-py 0.19.0 gguf.quants.dequantize",
               "tensors": list(main(sys.argv[1]))}, sys.stdout, indent=1)
    print()
