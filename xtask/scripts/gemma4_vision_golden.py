#!/usr/bin/env python3
"""Tiny random Gemma 4 models with a vision tower, converted with llama.cpp's converter, and
transformers' outputs on test images as the goldens for wgemma-vision.

Regenerate (from the repository root, where torch, transformers 5.23 and numpy are installed
and LLAMA_CPP holds llama.cpp's source with `convert_hf_to_gguf.py` and `gguf-py`; the lent GPU
machine has them: `bash benches/h100.sh vision-golden` runs this and brings the files back):

    python3 xtask/scripts/gemma4_vision_golden.py --llama-cpp LLAMA_CPP

Variants (text model as in gemma4_tiny_fixtures.py, vision tower 64 wide, 2 layers, 4 heads):
  e2b   E2B-like text (per-layer embeddings, shared KV), clamped linears with finite ranges,
        no standardisation; image tokens attend causally
  moe   26B-like text (MoE), no clamps, standardisation after pooling, and image tokens
        attending bidirectionally within their image on sliding layers

Every parameter and clamp is drawn from a generator seeded by the variant and the parameter's
name, so adding parts to the models later leaves the existing ones unchanged. The tokenizer is
gemma4_tiny_fixtures.py's byte-fallback BPE with the multimodal markers added as control tokens.

For each variant, the model is saved as a Hugging Face directory and converted twice with
`convert_hf_to_gguf.py --outtype f32`: the text model, and (`--mmproj`) the projector file.
Then transformers (float32, eager attention) runs the default Gemma 4 image processor (280-token
default replaced by the budget below) and the model on
  * `exact_480x336` at budget 70: needs no resize (21 x 30 patches, 70 soft tokens),
  * `up_97x61` at budget 70: scaled up to 480 x 288 (18 x 30 patches, 60 soft tokens),
and records, per image, the patch embedding (after the position tables), the output of encoder
layer 0, the encoder output, the pooled tower output (x sqrt(D), standardised) and the soft
tokens as float32 .npy; then one prompt holding both images (text, image, text, image, text)
teacher-forced: the argmax and top-1/top-2 margin at every position and the logits rows at a
few positions.

Writes
    crates/gemma4-vision/tests/fixtures/gemma4_tiny_vision_{e2b,moe}.gguf          text model
    crates/gemma4-vision/tests/fixtures/gemma4_tiny_vision_{e2b,moe}_mmproj.gguf   projector
    crates/gemma4-vision/tests/fixtures/exact_480x336.png
    crates/gemma4-vision/tests/golden/vision_{VARIANT}_{IMAGE}_{STAGE}.npy
    crates/gemma4-vision/tests/golden/vision_{VARIANT}.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemma4_image_golden as images  # noqa: E402
import gemma4_tiny_fixtures as fx  # noqa: E402

COMMAND = "python3 xtask/scripts/gemma4_vision_golden.py --llama-cpp LLAMA_CPP"
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "crates/gemma4-vision/tests/fixtures"
GOLDEN = ROOT / "crates/gemma4-vision/tests/golden"

MULTIMODAL = ["<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>", "<|video|>"]
BOI, EOI, IMAGE, BOA, EOA, AUDIO, VIDEO = range(6, 6 + len(MULTIMODAL))
FIRST_TEXT_ID = 6 + len(MULTIMODAL) + 256   # past the specials and the byte tokens

VISION = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=16,
    pooling_kernel_size=3,
    patch_size=16,
    position_embedding_size=128,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
)
VARIANTS = {
    "e2b": dict(seed=4001, text="e2b", clamps=True, standardize=False, bidirectional=None),
    "moe": dict(seed=4002, text="moe", clamps=False, standardize=True, bidirectional="vision"),
}
# (name, width, height, budget)
IMAGES = [("exact_480x336", 480, 336, 70), ("up_97x61", 97, 61, 70)]
STAGES = ["patch_embed", "layer0", "encoder", "pooled", "soft_tokens"]
# The prompt: text ids before, between and after the two images.
TEXT_RUNS = [6, 5, 4]
LOGIT_ROWS = 4


def generator(seed, name):
    import torch

    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def random_value(name, shape, g):
    """A parameter's random value by what it is (see gemma4_tiny_fixtures.randomize)."""
    import torch

    leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
    if len(shape) == 1:
        if leaf in ("q_norm", "k_norm"):
            return 0.4 + 0.1 * torch.randn(shape, generator=g)
        if name.endswith("per_expert_scale"):
            return 0.5 + torch.rand(shape, generator=g)
        if name == "model.language_model.norm.weight":
            return (6.0 / fx.EMBED_RMS) * (1.0 + 0.15 * torch.randn(shape, generator=g))
        if name.endswith("std_bias"):
            return 0.5 * torch.randn(shape, generator=g)
        if name.endswith("std_scale"):
            return 0.5 + torch.rand(shape, generator=g)
        return 1.0 + 0.3 * torch.randn(shape, generator=g)
    if name.endswith("embed_tokens_per_layer.weight"):
        return 0.3 * torch.randn(shape, generator=g)
    if name.endswith("embed_tokens.weight"):
        return (fx.EMBED_RMS / shape[1] ** 0.5) * torch.randn(shape, generator=g)
    if name.endswith("router.proj.weight"):
        return 2.0 * torch.randn(shape, generator=g)
    if name.endswith("position_embedding_table"):
        return 0.5 * torch.randn(shape, generator=g)
    if name.endswith("embedding_projection.weight"):
        return 0.5 * torch.randn(shape, generator=g) / shape[-1] ** 0.5
    return torch.randn(shape, generator=g) / shape[-1] ** 0.5


def randomize(model, seed):
    import torch

    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            p.copy_(random_value(name, tuple(p.shape), generator(seed, name)).to(torch.float32))
        for name, b in sorted(model.named_buffers()):
            g = generator(seed, name)
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            elif name.endswith(("input_min", "output_min")):
                b.copy_(-(1.5 + torch.rand(b.shape, generator=g)))
            elif name.endswith(("input_max", "output_max")):
                b.copy_(1.5 + torch.rand(b.shape, generator=g))
            elif name.endswith(("std_bias", "std_scale")):
                b.copy_(random_value(name, tuple(b.shape), g))
    return model


def build_tokenizer(out_dir):
    """gemma4_tiny_fixtures' tokenizer with the multimodal markers as control tokens."""
    fx.SPECIALS = fx.SPECIALS[:6] + MULTIMODAL
    hf = fx.build_tokenizer(out_dir, MULTIMODAL)
    for i, s in enumerate(MULTIMODAL):
        assert hf.convert_tokens_to_ids(s) == 6 + i, s
        assert len(hf.encode(s, add_special_tokens=False)) == 1, s
    return hf


def build_model(variant, out_dir):
    import torch
    from transformers import (Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig,
                              Gemma4VisionConfig)

    v = VARIANTS[variant]
    text = fx.config_kwargs(v["text"])
    if v["bidirectional"]:
        text["use_bidirectional_attention"] = v["bidirectional"]
    vision = dict(VISION, use_clipped_linears=v["clamps"], standardize=v["standardize"])
    cfg = Gemma4Config(
        text_config=Gemma4TextConfig(**text), vision_config=Gemma4VisionConfig(**vision),
        audio_config=None, boi_token_id=BOI, eoi_token_id=EOI, image_token_id=IMAGE,
        video_token_id=VIDEO, boa_token_id=BOA, eoa_token_index=EOA, audio_token_id=AUDIO,
        tie_word_embeddings=True)
    model = Gemma4ForConditionalGeneration(cfg).to(torch.float32).eval()
    randomize(model, v["seed"])
    model.save_pretrained(out_dir)
    return Gemma4ForConditionalGeneration.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager").eval()


def convert(llama_cpp, model_dir, out, mmproj):
    env = dict(os.environ, PYTHONPATH=str(Path(llama_cpp) / "gguf-py"))
    cmd = [sys.executable, str(Path(llama_cpp) / "convert_hf_to_gguf.py"), str(model_dir),
           "--outtype", "f32", "--outfile", str(out)] + (["--mmproj"] if mmproj else [])
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")


def check_control_tokens(llama_cpp, path):
    """The converted vocabulary marks the multimodal markers as control tokens (type 3), as
    the real Gemma 4 vocabulary does, so that templates' markers parse as one token each."""
    sys.path.insert(0, str(Path(llama_cpp) / "gguf-py"))
    import gguf

    r = gguf.GGUFReader(str(path))
    types = r.fields["tokenizer.ggml.token_type"]
    for i in range(6, 6 + len(MULTIMODAL)):
        t = int(types.parts[types.data[i]][0])
        assert t == 3, f"token {i} has type {t}, not control"


def processed(path, budget):
    from PIL import Image
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

    out = Gemma4ImageProcessor()(images=[Image.open(path).convert("RGB")], max_soft_tokens=budget,
                                 return_tensors="pt")
    return out["pixel_values"], out["image_position_ids"]


def tower_stages(model, pixels, positions):
    """The tower's intermediates on one image, real patches only, float32 [rows, width]."""
    import torch

    tower = model.model.vision_tower
    seen = {}
    hooks = [
        tower.patch_embedder.register_forward_hook(lambda m, i, o: seen.__setitem__("patch_embed", o)),
        tower.encoder.layers[0].register_forward_hook(lambda m, i, o: seen.__setitem__("layer0", o)),
        tower.encoder.register_forward_hook(
            lambda m, i, o: seen.__setitem__("encoder", o.last_hidden_state)),
    ]
    try:
        with torch.no_grad():
            feats = model.model.get_image_features(pixels, positions, return_dict=True)
    finally:
        for h in hooks:
            h.remove()
    real = (positions[0] >= 0).all(-1)
    out = {k: seen[k][0][real] for k in ("patch_embed", "layer0", "encoder")}
    out["pooled"] = feats.last_hidden_state
    out["soft_tokens"] = feats.pooler_output[0]
    return {k: v.to(torch.float32).numpy() for k, v in out.items()}, positions[0][real].numpy()


def prompt(variant, counts):
    """BOS, then text runs around the images' marker blocks; ids drawn from the text range."""
    rng = np.random.default_rng(VARIANTS[variant]["seed"] + 11)
    ids = [fx.BOS]
    for i, run in enumerate(TEXT_RUNS):
        ids += [int(t) for t in rng.integers(FIRST_TEXT_ID, fx.VOCAB, run)]
        if i < len(counts):
            ids += [BOI] + [IMAGE] * counts[i] + [EOI]
    return ids


def teacher_forced(model, ids, pixels, positions, bidirectional):
    import torch

    input_ids = torch.tensor([ids])
    kw = {}
    if bidirectional:
        kw["mm_token_type_ids"] = (input_ids == IMAGE).long()
    with torch.no_grad():
        out = model(input_ids=input_ids, pixel_values=pixels, image_position_ids=positions,
                    use_cache=False, **kw)
    logits = out.logits[0].to(torch.float32).numpy()
    srt = np.sort(logits, axis=-1)
    rows = sorted({0, len(ids) // 3, (2 * len(ids)) // 3, len(ids) - 1})[:LOGIT_ROWS]
    return {
        "argmax": [int(a) for a in logits.argmax(-1)],
        "margin": [fx.f32(m) for m in srt[:, -1] - srt[:, -2]],
        "rows": {str(r): [fx.f32(x) for x in logits[r]] for r in rows},
    }


def pixels_batch(cases):
    """The processor's outputs of several images, padded to one patch count."""
    import torch

    n = max(p.shape[1] for p, _ in cases)
    pix = torch.zeros(len(cases), n, cases[0][0].shape[2])
    pos = torch.full((len(cases), n, 2), -1, dtype=torch.long)
    for i, (p, q) in enumerate(cases):
        pix[i, :p.shape[1]] = p[0]
        pos[i, :q.shape[1]] = q[0]
    return pix, pos


def run_variant(variant, args, tmp):
    import transformers

    model_dir = tmp / variant
    model_dir.mkdir()
    build_tokenizer(model_dir)
    # the converter reads image_mean / image_std from preprocessor_config.json
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
    Gemma4ImageProcessor().save_pretrained(model_dir)
    model = build_model(variant, model_dir)
    stem = f"gemma4_tiny_vision_{variant}"
    convert(args.llama_cpp, model_dir, FIXTURES / f"{stem}.gguf", mmproj=False)
    check_control_tokens(args.llama_cpp, FIXTURES / f"{stem}.gguf")
    convert(args.llama_cpp, model_dir, FIXTURES / f"{stem}_mmproj.gguf", mmproj=True)

    record = {"command": COMMAND, "transformers": transformers.__version__, "variant": variant,
              "vision": VISION, **{k: v for k, v in VARIANTS[variant].items() if k != "seed"},
              "tokens": {"boi": BOI, "eoi": EOI, "image": IMAGE, "pad": 0}, "images": []}
    cases = []
    for name, w, h, budget in IMAGES:
        pixels, positions = processed(FIXTURES / f"{name}.png", budget)
        stages, real_positions = tower_stages(model, pixels, positions)
        for stage in STAGES:
            np.save(GOLDEN / f"vision_{variant}_{name}_{stage}.npy", stages[stage])
        cols, rows = (int(real_positions[:, k].max()) + 1 for k in (0, 1))
        record["images"].append({"name": name, "budget": budget, "patch_cols": cols,
                                 "patch_rows": rows, "tokens": int(stages["soft_tokens"].shape[0])})
        cases.append((pixels, positions))
        print(variant, name, {k: v.shape for k, v in stages.items()})
    ids = prompt(variant, [im["tokens"] for im in record["images"]])
    pix, pos = pixels_batch(cases)
    record["prompt"] = ids
    record["teacher_forced"] = teacher_forced(model, ids, pix, pos, VARIANTS[variant]["bidirectional"])
    margins = np.array(record["teacher_forced"]["margin"])
    print(variant, f"{len(ids)} positions, {int((margins >= 0.25).sum())} with margin >= 0.25")
    (GOLDEN / f"vision_{variant}.json").write_text(json.dumps(record, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True)
    args = ap.parse_args()
    FIXTURES.mkdir(parents=True, exist_ok=True)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    for name, w, h, _ in IMAGES:
        path = FIXTURES / f"{name}.png"
        if not path.exists():
            Image.fromarray(images.draw(w, h)).save(path)
    with tempfile.TemporaryDirectory() as tmp:
        for variant in VARIANTS:
            run_variant(variant, args, Path(tmp))


if __name__ == "__main__":
    main()
