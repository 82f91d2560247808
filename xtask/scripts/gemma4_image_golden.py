#!/usr/bin/env python3
"""transformers' Gemma 4 image preprocessing of a few test images, as goldens for wgemma-vision.

Regenerate (from the repository root, where torch, torchvision and transformers are installed;
the lent GPU machine has them: `bash benches/h100.sh vision` runs this and brings the files
back):

    python3 xtask/scripts/gemma4_image_golden.py

Draws the test images from formulas (smooth gradients, a checkerboard, fine stripes: edges
that a resize filter changes), saves them as PNG, and runs transformers' default Gemma 4 image
processor (`Gemma4ImageProcessor`, torchvision's antialiased bicubic) on each at some token
budgets. For each case it records the processor's patch grid, the positions of the real
patches, and the resized image put back together from the patches (8-bit levels, as PNG: the
values are levels / 255 exactly, so nothing is lost).

Writes
    crates/gemma4-vision/tests/fixtures/{NAME}.png               the inputs
    crates/gemma4-vision/tests/golden/{NAME}_{BUDGET}.png        the resized images
    crates/gemma4-vision/tests/golden/preprocess.json            the cases
"""
import json
from pathlib import Path

import numpy as np
import transformers
from PIL import Image

COMMAND = "python3 xtask/scripts/gemma4_image_golden.py"
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "crates/gemma4-vision/tests/fixtures"
GOLDEN = ROOT / "crates/gemma4-vision/tests/golden"
# (name, width, height, budgets): scaled up, scaled down, thin, already at its size.
IMAGES = [
    ("up_97x61", 97, 61, [70, 280]),
    ("down_700x300", 700, 300, [70, 140]),
    ("thin_400x7", 400, 7, [70]),
    ("exact_960x624", 960, 624, [280]),
]


def draw(w, h):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255 * x / max(w - 1, 1)
    g = 255 * (0.5 + 0.5 * np.sin(x / 7.0 + y / 5.0))
    checker = ((x // 8 + y // 8) % 2) * 200
    stripes = (x % 3 == 0) * 55
    b = checker + stripes
    return np.clip(np.stack([r, g, b], -1).round(), 0, 255).astype(np.uint8)


def processor():
    try:
        from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
        return Gemma4ImageProcessor(), "Gemma4ImageProcessor"
    except ImportError:
        from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
        return Gemma4ImageProcessorPil(), "Gemma4ImageProcessorPil"


def main():
    FIXTURES.mkdir(parents=True, exist_ok=True)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    ip, ip_name = processor()
    cases = []
    for name, w, h, budgets in IMAGES:
        path = FIXTURES / f"{name}.png"
        Image.fromarray(draw(w, h)).save(path)
        image = Image.open(path).convert("RGB")
        for budget in budgets:
            out = ip(images=[image], max_soft_tokens=budget, return_tensors="np")
            print(name, budget, {k: np.asarray(v).shape for k, v in out.items()})
            pixels = np.asarray(out["pixel_values"][0], dtype=np.float64)
            positions = np.asarray(out["image_position_ids"][0])
            real = positions[:, 0] >= 0
            pixels, positions = pixels[real], positions[real]
            cols, rows = int(positions[:, 0].max()) + 1, int(positions[:, 1].max()) + 1
            levels = np.rint(pixels * 255)
            assert np.abs(levels / 255 - pixels).max() < 1e-6, "values are not levels / 255"
            image_out = np.zeros((rows * 16, cols * 16, 3), np.uint8)
            for (px, py), patch in zip(positions, levels):
                image_out[py * 16:(py + 1) * 16, px * 16:(px + 1) * 16] = patch.reshape(16, 16, 3)
            Image.fromarray(image_out).save(GOLDEN / f"{name}_{budget}.png")
            cases.append({
                "image": f"{name}.png",
                "budget": budget,
                "resized": f"{name}_{budget}.png",
                "rows": rows,
                "cols": cols,
                # The processor's patch order: each real patch's (x, y).
                "positions": positions.tolist(),
            })
            print(f"{name} at {budget}: {rows} x {cols} patches")
    (GOLDEN / "preprocess.json").write_text(json.dumps({
        "command": COMMAND,
        "transformers": transformers.__version__,
        "processor": ip_name,
        "cases": cases,
    }) + "\n")


if __name__ == "__main__":
    main()
