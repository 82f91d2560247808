#!/usr/bin/env python3
"""Random blocks of every dtype our CPU dequantizer handles, dequantized by gguf-py.

Block bytes are random except the f16/bf16 scale fields, which are set to random normal
numbers so no block decodes to NaN. The Rust test `random_blocks_match_gguf_py` decodes the
same bytes and compares element by element.

    python3 -m pip install gguf==0.19.0 numpy
    python3 xtask/scripts/dtype_golden.py > crates/gguf/tests/golden/random_blocks_gguf_py.json
"""
import json

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of the f16 fields inside one block, per type.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
}

rng = np.random.default_rng(20261122)
out = []
for qtype in [T.F32, T.F16, T.BF16, *F16_FIELDS]:
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = 3
    if qtype == T.F32:
        raw = rng.normal(size=n_blocks * 8).astype("<f4").tobytes()
        n_blocks = 8 * n_blocks
    elif qtype == T.F16:
        raw = rng.normal(size=n_blocks * 8).astype("<f2").tobytes()
        n_blocks = 8 * n_blocks
    elif qtype == T.BF16:
        f = rng.normal(size=n_blocks * 8).astype("<f4")
        raw = (f.view("<u4") >> 16).astype("<u2").tobytes()
        n_blocks = 8 * n_blocks
    else:
        b = bytearray(rng.integers(0, 256, size=n_blocks * block_bytes, dtype=np.uint8).tobytes())
        for blk in range(n_blocks):
            for off in F16_FIELDS[qtype]:
                v = np.float16(rng.normal() * 0.05).tobytes()
                b[blk * block_bytes + off: blk * block_bytes + off + 2] = v
        raw = bytes(b)
    x = dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32).reshape(-1)
    out.append({"dtype": qtype.name, "hex": raw.hex(), "values": [float(v) for v in x]})

print(json.dumps({"tool": "gguf-py 0.19.0 gguf.quants.dequantize", "seed": 20261122, "cases": out}))
