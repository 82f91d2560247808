#!/usr/bin/env python3
"""A tiny random Gemma 4 model with an audio tower, converted with llama.cpp's converter, and
transformers' outputs on a test clip as the goldens for wgemma-audio (issue #27).

Regenerate on the lent GPU machine (torch, transformers 5.23 from `.dev/`, llama.cpp's source
from `.dev/llama.tar.xz`); one device call with carry [".dev"]:

    bash benches/h100.sh audio_golden

which runs, from the repository root,

    python3 xtask/scripts/gemma4_audio_golden.py --llama-cpp LLAMA_CPP

and brings back $OUT/audio-golden.tgz (crates/gemma4-audio/tests/{fixtures,golden}), the log
$OUT/audio-golden.log and its summary tail $OUT/audio-golden.txt. Without torch,
`--dry-run` checks everything that does not need it (clip, configs, the expected tensor and
key names, the file layout and sizes) and writes nothing:

    python3 xtask/scripts/gemma4_audio_golden.py --dry-run [--llama-cpp LLAMA_CPP]

(with transformers importable, e.g. PYTHONPATH=/work/dl/py:/work/dl/tfpkg, it also runs the
feature extractor and builds the configs; with --llama-cpp it checks the name mapping against
gguf-py's tables).

The model (everything seeded by the parameter's name, see gemma4_vision_golden.py):
  text    gemma4_tiny_fixtures.py's E2B-like config (PLE, shared KV, double-wide MLP), the
          same one as gemma4_vision_golden.py's e2b variant; tokenizer: its byte-fallback BPE
          with the multimodal markers as control tokens (ids 6..12: <|image> <image|> <|image|>
          <|audio> <audio|> <|audio|> <|video|>, so <|audio> = 9, <audio|> = 10, <|audio|> = 11)
  audio   Gemma4AudioConfig with the real structure, shrunk: hidden 64, 2 conformer layers,
          4 heads (head_dim 16), FFN 4x (fixed in HF), SSCP channels [128, 8], conv kernel 5,
          chunk 12, context_left 13, context_right 0, logit cap 50, residual weight 0.5,
          eps 1e-6, output_proj_dims 48 (unlike both widths, so mix-ups show), clipped linears
          with finite ranges drawn per buffer (q, k and v differ), per_dim_scale ~ 1 + N(0,1)
          (softplus 0.3..3, the logit cap bends the larger logits)
  vision  a stub (16 wide, 1 layer): llama.cpp's mmproj converter for
          Gemma4ForConditionalGeneration asserts a vision config. It is never run here.
The first SSCP channel count stays 128: HF sizes the SSCP linear's input as
`(channels[0] // 4) * channels[1]`, which equals the real flattened width (128 mel / 4 = 32
frequencies x channels[1]) only when channels[0] is 128.

Input: crates/gemma4-audio/tests/fixtures/a16k.wav (16 kHz mono 16-bit, 20864 samples =
163 x 128) read with `wave` as int16 / 32768, through Gemma4AudioFeatureExtractor (a list of one
clip, as the processor passes it): 130 frames, all valid -> 65 -> 33 encoder positions = 33 soft
tokens (3 attention chunks of 12, the last one padded). Its features differ slightly from
a16k.features.npy, which came from the float source before 16-bit rounding.

Writes
    crates/gemma4-audio/tests/fixtures/gemma4_tiny_audio.gguf          text model (F32)
    crates/gemma4-audio/tests/fixtures/gemma4_tiny_audio_mmproj.gguf   projector (F32)
    crates/gemma4-audio/tests/golden/audio_e2b_a16k_{STAGE}.npy       float32, [rows, width]
        features     the extractor's input_features [130, 128] (what the tower gets)
        mask         input_features_mask as 0/1 [130]
        sscp         after the SSCP input projection (`subsample_conv_projection`) [33, 64]
        layer0       output of conformer block 0 (`layers[0]`) [33, 64]
        encoder      tower output before `output_proj` (after the last block's norm_out) [33, 64]
        output_proj  after `output_proj` (Linear with bias) [33, 48]
        soft_tokens  after `embed_audio` (RMSNorm without weight, then Linear), valid positions
                     only, as injected [33, 64]
    crates/gemma4-audio/tests/golden/audio_e2b.json: configs, token ids, soft token count,
        the prompt (text and ids) and its teacher-forced argmax / top-1 margin at every
        position / full logits rows at 4 positions (the same "teacher_forced" shape as
        vision_e2b.json), the fraction of values each audio ClippableLinear clamps, and the
        converted files' audio keys and tensors with the checks below.
The prompt is built as Gemma4Processor does (`replace_audio_token`: <|audio> + N x <|audio|> +
<audio|>, no newlines) inside a user turn with text on both sides and a model answer after it.

Verified by reading transformers 5.23 (modeling_gemma4.py, configuration_gemma4.py,
feature_extraction_gemma4.py, processing_gemma4.py) and llama.cpp's converter (the source in
.dev/llama.tar.xz: conversion/gemma.py `Gemma4VisionAudioModel`, conversion/base.py
`MmprojModel`, gguf-py tensor_mapping.py / constants.py) and tools/mtmd (clip.cpp, gemma4a.cpp);
the run re-checks the converted files against the model:
  * Module names: model.model.audio_tower = Gemma4AudioModel with subsample_conv_projection
    (layer0/layer1 .conv/.norm, input_proj_linear), rel_pos_enc, layers[i] (feed_forward1/2,
    self_attn, lconv1d, norm_pre_attn, norm_post_attn, norm_out), output_proj;
    model.model.embed_audio = Gemma4MultimodalEmbedder (embedding_pre_projection_norm without
    weight, then embedding_projection). Clamps are buffers input_min/input_max/output_min/
    output_max on each Gemma4ClippableLinear (10 per layer), whose weight is `.linear.weight`.
    Gemma4Model.forward keeps only the soft tokens whose subsampled mask is true.
  * Tensor names written (HF -> GGUF): layer{i}.conv -> a.conv1d.{i}.weight (ne [3,3,Cin,Cout]),
    layer{i}.norm -> a.conv1d.{i}.norm.weight, input_proj_linear -> a.input_projection.weight,
    per layer a.blk.N.: feed_forward1 pre_layer_norm/ffw_layer_1/ffw_layer_2/post_layer_norm ->
    ffn_norm/ffn_up/ffn_down/ffn_post_norm, feed_forward2 -> the same with _1, norm_pre_attn ->
    attn_pre_norm, q/k/v_proj/post -> attn_q/attn_k/attn_v/attn_out, relative_k_proj ->
    attn_k_rel, per_dim_scale -> per_dim_scale.weight, norm_post_attn -> attn_post_norm,
    lconv1d.pre_layer_norm -> conv_norm, linear_start -> conv_pw1, depthwise_conv1d -> conv_dw
    (reshaped [D,1,K] -> [D,K], ne [K, D]), lconv1d.conv_norm -> norm_conv, linear_end ->
    conv_pw2, norm_out -> ln2; output_proj -> a.pre_encode.out.{weight,bias};
    embed_audio.embedding_projection -> mm.a.input_projection.weight. No tensor for the
    embedder norm (no weight; llama.cpp's optional mm.a.soft_emb_norm stays absent).
  * per_dim_scale is stored softplus-applied (the converter calls softplus); llama.cpp
    multiplies by it as is.
  * Clamps: each 0-d buffer becomes an F32 [1] tensor `<weight name minus .weight>.input_min`
    etc.; llama.cpp looks them up for every weight it multiplies (absent -> +-FLT_MAX).
  * Keys: general.architecture clip, clip.has_audio_encoder, clip.audio.projector_type gemma4a,
    clip.audio.num_mel_bins (from `input_feat_size`, absent in HF's config -> 128),
    clip.audio.embedding_length, clip.audio.feed_forward_length (written as 4 x hidden, not
    read), clip.audio.block_count, clip.audio.attention.head_count,
    clip.audio.attention.layer_norm_epsilon (from `layer_norm_eps`, absent -> 1e-6; HF's key is
    rms_norm_eps, and clip.cpp forces 1e-6 for gemma4a anyway), clip.audio.projection_dim
    (text hidden). Chunk 12, context 13, logit cap 50, residual 0.5, the conv kernel (left pad
    4, so 5), the mel front end and the sinusoid are not written: llama.cpp hard-codes them
    (clip.cpp, gemma4a.cpp).
  * The text GGUF skips every audio tensor (names with "audio_" / "audio.").
The converter's output agrees with multimodal.md section 2 on every name, the softplus, the
clamp scalars and the keys (conv_norm = the conv module's pre-norm, norm_conv = the norm after
the depthwise conv, which clip.cpp loads crosswise on purpose; a.pre_encode.out = output_proj,
not Ollama's SSCP linear; ln2 = the block's norm_out). What section 2 does not say: the
converter writes feed_forward_length, num_mel_bins and the eps without reading them from the
model (above); it asserts a vision config, so an audio-only Gemma 4 cannot become an mmproj; and
gemma4a.cpp does not mask invalid frames between the two SSCP convolutions as HF does (this
clip has no invalid frame, so the goldens do not show it).
"""
import argparse
import hashlib
import json
import math
import sys
import tempfile
import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemma4_tiny_fixtures as fx  # noqa: E402

COMMAND = "python3 xtask/scripts/gemma4_audio_golden.py --llama-cpp LLAMA_CPP"
REGENERATE = "bash benches/h100.sh audio_golden"
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "crates/gemma4-audio/tests/fixtures"
GOLDEN = ROOT / "crates/gemma4-audio/tests/golden"

# As in gemma4_vision_golden.py (checked against it at run time).
MULTIMODAL = ["<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>", "<|video|>"]
BOI, EOI, IMAGE, BOA, EOA, AUDIO, VIDEO = range(6, 6 + len(MULTIMODAL))

VARIANT = "e2b"
SEED = 4003
STEM = "gemma4_tiny_audio"
AUDIO_CFG = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    hidden_act="silu",
    subsampling_conv_channels=[128, 8],
    conv_kernel_size=5,
    residual_weight=0.5,
    attention_chunk_size=12,
    attention_context_left=13,
    attention_context_right=0,
    attention_logit_cap=50.0,
    attention_invalid_logits_value=-1.0e9,
    use_clipped_linears=True,
    rms_norm_eps=1e-6,
    gradient_clipping=1e10,
    output_proj_dims=48,
)
VISION_STUB = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    pooling_kernel_size=3,
    patch_size=16,
    position_embedding_size=64,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    use_clipped_linears=False,
    standardize=False,
)
# Clamp ranges of the audio ClippableLinears: min = -(LO + SPAN*u), max = LO + SPAN*u, u ~ U(0,1)
# drawn per buffer. Their inputs are mostly RMS-normed (rms ~1), so a few to tens of percent
# of the values get clamped (the run records the fractions).
CLAMP_LO, CLAMP_SPAN = 0.75, 1.25

# a16k (a multiple of 128 samples, every frame valid) carries the prompt; b16k (20130 float
# samples, not a multiple of 128: the pad makes the last frames invalid) only the tower stages.
CLIPS = ["a16k", "b16k"]
SAMPLE_RATE = 16000
N_MELS = 128
HOP, FRAME = 160, 320
STAGES = ["features", "mask", "sscp", "layer0", "encoder", "output_proj", "soft_tokens"]
# The user turn as the chat template writes it, with the processor's placeholder, then the
# start of a model answer (teacher-forced as well).
PROMPT = "<|turn>user\nListen to this clip:<|audio|>What rises in it?<turn|>\n<|turn>model\nA tone that sweeps up."
LOGIT_ROWS = 4
MIN_MARGIN = 0.25   # reported: positions whose top-1 margin is at least this

LINEAR_KEYS = (".weight", ".bias", ".input_max", ".input_min", ".output_max", ".output_min")
CLAMP_KEYS = ("input_min", "input_max", "output_min", "output_max")
CLIPPABLE = {   # per conformer layer: HF module -> (GGUF name, (out, in) in units of hidden)
    "feed_forward1.ffw_layer_1": ("ffn_up", (4, 1)),
    "feed_forward1.ffw_layer_2": ("ffn_down", (1, 4)),
    "feed_forward2.ffw_layer_1": ("ffn_up_1", (4, 1)),
    "feed_forward2.ffw_layer_2": ("ffn_down_1", (1, 4)),
    "self_attn.q_proj": ("attn_q", (1, 1)),
    "self_attn.k_proj": ("attn_k", (1, 1)),
    "self_attn.v_proj": ("attn_v", (1, 1)),
    "self_attn.post": ("attn_out", (1, 1)),
    "lconv1d.linear_start": ("conv_pw1", (2, 1)),
    "lconv1d.linear_end": ("conv_pw2", (1, 1)),
}
NORMS = {       # per conformer layer: HF RMSNorm -> GGUF name
    "feed_forward1.pre_layer_norm": "ffn_norm",
    "feed_forward1.post_layer_norm": "ffn_post_norm",
    "feed_forward2.pre_layer_norm": "ffn_norm_1",
    "feed_forward2.post_layer_norm": "ffn_post_norm_1",
    "norm_pre_attn": "attn_pre_norm",
    "norm_post_attn": "attn_post_norm",
    "lconv1d.pre_layer_norm": "conv_norm",
    "lconv1d.conv_norm": "norm_conv",
    "norm_out": "ln2",
}
TOWER = "model.audio_tower."


# ---------------------------------------------------------------------------------------------
# Without torch: clip, token counts, expected tensors and names


def read_wav(path):
    """16-bit PCM WAV -> float32 samples (int16 / 32768) and the sample rate."""
    with wave.open(str(path), "rb") as w:
        assert w.getcomptype() == "NONE", f"{path}: compressed WAV"
        assert w.getsampwidth() == 2, f"{path}: {8 * w.getsampwidth()}-bit, want 16"
        assert w.getnchannels() == 1, f"{path}: {w.getnchannels()} channels, want mono"
        rate = w.getframerate()
        raw = w.readframes(w.getnframes())
    return (np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0), rate


def read_clip(clip):
    """A clip's samples and rate: its 16-bit WAV, else its float32 .npy at 16 kHz."""
    wav = FIXTURES / f"{clip}.wav"
    if wav.exists():
        return read_wav(wav)
    return np.load(FIXTURES / f"{clip}.f32.npy").astype(np.float32), SAMPLE_RATE


def mel_frames(n_samples):
    """Frames of Gemma4AudioFeatureExtractor for a clip padded to a multiple of 128."""
    n = -(-n_samples // 128) * 128
    return (n + FRAME // 2 - (FRAME + 1)) // HOP + 1


def subsampled(mask):
    """The SSCP's two stride-2 convolutions on a frame mask (mask[::2] twice)."""
    m = np.asarray(mask, dtype=bool)
    for _ in range(2):
        m = m[::2]
    return m


def conv_out(t):
    return (t + 2 - 3) // 2 + 1


def hf_audio_tensors(a, text_hidden):
    """The audio tower's and embedder's state-dict entries, {name: shape}, as transformers 5.23
    builds them (non-persistent buffers such as softcap and inv_timescales excluded)."""
    d, (c0, c1), k = a["hidden_size"], a["subsampling_conv_channels"], a["conv_kernel_size"]
    dh, p = d // a["num_attention_heads"], a["output_proj_dims"]
    s = TOWER + "subsample_conv_projection."
    out = {}
    for i, (cin, cout) in enumerate([(1, c0), (c0, c1)]):
        out[f"{s}layer{i}.conv.weight"] = (cout, cin, 3, 3)
        out[f"{s}layer{i}.norm.weight"] = (cout,)
    out[f"{s}input_proj_linear.weight"] = (d, (c0 // 4) * c1)
    for n in range(a["num_hidden_layers"]):
        layer = f"{TOWER}layers.{n}."
        for mod, (_, (o, i)) in CLIPPABLE.items():
            out[f"{layer}{mod}.linear.weight"] = (o * d, i * d)
            for c in CLAMP_KEYS:
                out[f"{layer}{mod}.{c}"] = ()
        for mod in NORMS:
            out[f"{layer}{mod}.weight"] = (d,)
        out[f"{layer}self_attn.relative_k_proj.weight"] = (d, d)
        out[f"{layer}self_attn.per_dim_scale"] = (dh,)
        out[f"{layer}lconv1d.depthwise_conv1d.weight"] = (d, 1, k)
    out[TOWER + "output_proj.weight"] = (p, d)
    out[TOWER + "output_proj.bias"] = (p,)
    out["model.embed_audio.embedding_projection.weight"] = (text_hidden, p)
    return out


def gguf_name(hf):
    """Our reading of llama.cpp's converter: HF name -> (GGUF name, transform of the value)."""
    keep = None
    if hf == "model.embed_audio.embedding_projection.weight":
        return "mm.a.input_projection.weight", keep
    if hf.startswith(TOWER + "subsample_conv_projection."):
        rest = hf[len(TOWER + "subsample_conv_projection."):]
        if rest == "input_proj_linear.weight":
            return "a.input_projection.weight", keep
        layer, part, leaf = rest.split(".")
        assert layer in ("layer0", "layer1") and leaf == "weight", hf
        return f"a.conv1d.{layer[-1]}." + ("weight" if part == "conv" else "norm.weight"), keep
    if hf.startswith(TOWER + "output_proj."):
        return "a.pre_encode.out." + hf.rsplit(".", 1)[1], keep
    assert hf.startswith(TOWER + "layers."), hf
    n, rest = hf[len(TOWER + "layers."):].split(".", 1)
    blk = f"a.blk.{n}."
    if rest == "self_attn.per_dim_scale":
        return blk + "per_dim_scale.weight", "softplus"
    if rest == "self_attn.relative_k_proj.weight":
        return blk + "attn_k_rel.weight", keep
    if rest == "lconv1d.depthwise_conv1d.weight":
        return blk + "conv_dw.weight", "squeeze1"
    mod, leaf = rest.rsplit(".", 1)
    if mod.endswith(".linear"):
        mod = mod[: -len(".linear")]
    if mod in CLIPPABLE:
        return blk + CLIPPABLE[mod][0] + "." + leaf, ("scalar" if leaf in CLAMP_KEYS else keep)
    if mod in NORMS:
        return blk + NORMS[mod] + "." + leaf, keep
    raise KeyError(f"no GGUF name for {hf}")


def gguf_shape(hf_shape, transform):
    """The GGUF ne (fastest first) of a tensor after the converter's transform."""
    shape = tuple(hf_shape)
    if transform == "scalar":
        shape = (1,)
    elif transform == "squeeze1":
        shape = (shape[0], shape[2])
    return list(reversed(shape))


def converter_names(llama_cpp, hf_names):
    """llama.cpp's own mapping of the audio tensors (Gemma4VisionAudioModel.modify_tensors'
    renames, then gguf-py's TensorNameMap), {hf: gguf or None}."""
    sys.path.insert(0, str(Path(llama_cpp) / "gguf-py"))
    import gguf

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 128)   # 128: vision + audio
    out = {}
    for hf in hf_names:
        name = hf.replace("model.audio_tower.", "conformer.").replace(".linear.", ".")
        if name.endswith(("per_dim_key_scale", "per_dim_scale")):
            name += ".weight"
        out[hf] = tmap.get_name(name, try_suffixes=LINEAR_KEYS)
    return out


def expected_mmproj_keys(text_hidden):
    a = AUDIO_CFG
    return {
        "general.architecture": "clip",
        "clip.has_audio_encoder": True,
        "clip.has_vision_encoder": True,
        "clip.audio.projector_type": "gemma4a",
        "clip.vision.projector_type": "gemma4v",
        "clip.audio.num_mel_bins": N_MELS,
        "clip.audio.embedding_length": a["hidden_size"],
        "clip.audio.feed_forward_length": 4 * a["hidden_size"],
        "clip.audio.block_count": a["num_hidden_layers"],
        "clip.audio.attention.head_count": a["num_attention_heads"],
        "clip.audio.attention.layer_norm_epsilon": 1e-6,
        "clip.audio.projection_dim": text_hidden,
    }


def vision_stub_params(v, text_hidden):
    d, f, l = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
    hd = v["num_attention_heads"] * v["head_dim"]
    kv = v["num_key_value_heads"] * v["head_dim"]
    per_layer = d * (hd + 2 * kv) + hd * d + 3 * d * f + 4 * d + 2 * v["head_dim"]
    return 3 * v["patch_size"] ** 2 * d + 2 * v["position_embedding_size"] * d + l * per_layer + d * text_hidden


def stats(x):
    x = np.asarray(x, dtype=np.float64)
    return f"min {x.min():+.4g} max {x.max():+.4g} rms {np.sqrt((x * x).mean()):.4g}"


def transformers_or_none():
    try:
        import transformers  # noqa: F401
        return transformers
    except Exception as e:   # numpy-only machine
        print(f"(transformers not importable here: {type(e).__name__}: {e})")
        return None


def features_of(samples):
    """transformers' Gemma4AudioFeatureExtractor on one clip -> (features [T, 128] f32, mask [T])."""
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    out = Gemma4AudioFeatureExtractor()([samples])   # a list of one clip, as the processor does
    return (np.asarray(out["input_features"][0], dtype=np.float32),
            np.asarray(out["input_features_mask"][0]).astype(bool))


def configs():
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4TextConfig, Gemma4VisionConfig

    return Gemma4Config(
        text_config=Gemma4TextConfig(**fx.config_kwargs(VARIANT)),
        vision_config=Gemma4VisionConfig(**VISION_STUB), audio_config=Gemma4AudioConfig(**AUDIO_CFG),
        boi_token_id=BOI, eoi_token_id=EOI, image_token_id=IMAGE, video_token_id=VIDEO,
        boa_token_id=BOA, eoa_token_index=EOA, audio_token_id=AUDIO, tie_word_embeddings=True)


def check_saved_config(cfg):
    """config.json as save_pretrained writes it holds every key llama.cpp's converter reads."""
    d = json.loads(cfg.to_json_string(use_diff=True))
    missing = [f"audio_config.{k}" for k in ("hidden_size", "num_hidden_layers", "num_attention_heads")
               if k not in (d.get("audio_config") or {})]
    missing += [f"vision_config.{k}" for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                               "num_attention_heads", "patch_size")
                if k not in (d.get("vision_config") or {})]
    missing += [f"text_config.{k}" for k in ("hidden_size",) if k not in (d.get("text_config") or {})]
    return missing


def plan(args):
    """Everything that needs no torch; returns facts the real run reuses and checks."""
    a = AUDIO_CFG
    text_hidden = fx.config_kwargs(VARIANT)["hidden_size"]
    assert a["subsampling_conv_channels"][0] // 4 == N_MELS // 4, \
        "HF sizes the SSCP linear from channels[0] // 4: keep channels[0] = 128"
    assert a["hidden_size"] % a["num_attention_heads"] == 0
    info = {"text_hidden": text_hidden, "clips": {}, "warnings": []}

    tf = transformers_or_none()
    for clip in CLIPS:
        samples, rate = read_clip(clip)
        assert rate == SAMPLE_RATE, f"{clip}: {rate} Hz"
        assert clip != CLIPS[0] or samples.size % 128 == 0, f"{clip}: {samples.size} samples"
        frames = mel_frames(samples.size)
        t = conv_out(conv_out(frames))
        c = {"samples": int(samples.size), "frames": frames, "encoder_positions": t, "tokens": t}
        print(f"{clip}: {samples.size} samples ({samples.size / SAMPLE_RATE:.3f} s) -> {frames} frames -> "
              f"{conv_out(frames)} -> {t} encoder positions = soft tokens, "
              f"{-(-t // a['attention_chunk_size'])} attention chunks of {a['attention_chunk_size']}")
        if tf is not None:
            feats, mask = features_of(samples)
            assert feats.shape == (frames, N_MELS), feats.shape
            c["valid_frames"] = int(mask.sum())
            c["tokens"] = int(subsampled(mask).sum())
            print(f"{clip}: transformers features {list(feats.shape)} ({int(mask.sum())} valid) {stats(feats)}; "
                  f"{c['tokens']} soft tokens")
            old = FIXTURES / f"{clip}.features.npy"
            if old.exists():
                print(f"{clip}: vs {old.name} (float source, before 16-bit rounding): "
                      f"max |diff| {np.abs(np.load(old) - feats).max():.3g}")
        info["clips"][clip] = c

    names = hf_audio_tensors(a, text_hidden)
    table = {}
    for hf, shape in names.items():
        g, transform = gguf_name(hf)
        table[hf] = {"gguf": g, "ne": gguf_shape(shape, transform), "transform": transform}
    assert len({v["gguf"] for v in table.values()}) == len(table), "two HF tensors map to one name"
    n_audio = sum(math.prod(s) if s else 1 for s in names.values())
    print(f"audio tower + embedder: {len(names)} tensors, {n_audio} values")
    if args.llama_cpp:
        theirs = converter_names(args.llama_cpp, names)
        bad = {hf: (table[hf]["gguf"], g) for hf, g in theirs.items() if g != table[hf]["gguf"]}
        for hf, (ours, g) in sorted(bad.items()):
            print(f"  NAME MISMATCH {hf}: ours {ours}, gguf-py {g}")
        if bad:
            info["warnings"].append(f"{len(bad)} audio tensor names differ from gguf-py's mapping")
        print(f"names: {len(names) - len(bad)}/{len(names)} agree with {args.llama_cpp}/gguf-py")
    info["tensors"] = table

    if tf is not None:
        cfg = configs()
        missing = check_saved_config(cfg)
        if missing:
            info["warnings"].append(f"config.json lacks keys the converter reads: {missing}")
        print(f"configs: Gemma4Config builds (transformers {tf.__version__}); converter keys "
              + ("all saved" if not missing else f"MISSING {missing}"))

    # File sizes: F32 values plus the tokenizer and metadata (measured on the vision fixtures:
    # the text model 1369632 bytes, the same text config).
    n_vision = vision_stub_params(VISION_STUB, text_hidden)
    est = {f"{STEM}.gguf": 1_370_000, f"{STEM}_mmproj.gguf": 4 * (n_audio + n_vision) + 40_000}
    t = max(c["encoder_positions"] for c in info["clips"].values())
    per_clip = 4 * (2 * mel_frames(max(c["samples"] for c in info["clips"].values())) * (N_MELS + 1)
                    + t * (3 * a["hidden_size"] + a["output_proj_dims"] + text_hidden))
    est["goldens (npy + json)"] = len(CLIPS) * per_clip + 60_000
    info["estimate"] = est
    return info


def print_plan(info):
    print(f"would write under {FIXTURES.relative_to(ROOT)}: {STEM}.gguf, {STEM}_mmproj.gguf")
    for clip in CLIPS:
        print(f"would write under {GOLDEN.relative_to(ROOT)}: "
              + ", ".join(f"audio_{VARIANT}_{clip}_{s}.npy" for s in STAGES) + f", audio_{VARIANT}.json")
    for k, v in info["estimate"].items():
        print(f"  ~{v / 1e6:.2f} MB  {k}")
    print(f"  ~{sum(info['estimate'].values()) / 1e6:.2f} MB in all")
    print("expected mmproj keys: " + json.dumps(expected_mmproj_keys(info["text_hidden"])))
    print("expected audio tensors (GGUF name, ne, transform):")
    for hf, v in info["tensors"].items():
        if ".blk." in v["gguf"] and not v["gguf"].startswith("a.blk.0."):
            continue
        print(f"  {v['gguf']:40s} {str(v['ne']):18s} {v['transform'] or '':9s} <- {hf}")
    print("  (a.blk.1.* as a.blk.0.*)")
    skeleton = PROMPT.replace("<|audio|>", "<|audio>" + "<|audio|>" * 2 + "...<audio|>")
    print(f"prompt: <bos>{skeleton!r}")


# ---------------------------------------------------------------------------------------------
# With torch (the lent machine)


def vision_module():
    import gemma4_vision_golden as vg   # imports PIL and transformers

    assert vg.MULTIMODAL == MULTIMODAL and (vg.BOA, vg.EOA, vg.AUDIO) == (BOA, EOA, AUDIO)
    return vg


def is_audio(name):
    return "audio_tower" in name or "embed_audio" in name


def audio_value(name, shape, g, vg):
    import torch

    if name.endswith("per_dim_scale"):
        return 1.0 + torch.randn(shape, generator=g)
    if name.endswith(".bias"):
        return 0.2 * torch.randn(shape, generator=g)
    if len(shape) == 1:                     # RMSNorm and SSCP LayerNorm weights
        return 1.0 + 0.3 * torch.randn(shape, generator=g)
    if "embed_audio" in name:               # as the vision embedder: soft tokens ~ text embeddings
        return vg.random_value(name, shape, g)
    return torch.randn(shape, generator=g) / math.prod(shape[1:]) ** 0.5   # fan-in (convs too)


def randomize(model, seed, vg):
    import torch

    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            g = vg.generator(seed, name)
            shape = tuple(p.shape)
            v = audio_value(name, shape, g, vg) if is_audio(name) else vg.random_value(name, shape, g)
            p.copy_(v.to(torch.float32))
        for name, b in sorted(model.named_buffers()):
            g = vg.generator(seed, name)
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            elif name.endswith(("input_min", "output_min")):
                b.copy_(-(CLAMP_LO + CLAMP_SPAN * torch.rand(b.shape, generator=g)))
            elif name.endswith(("input_max", "output_max")):
                b.copy_(CLAMP_LO + CLAMP_SPAN * torch.rand(b.shape, generator=g))
    return model


def build_model(model_dir, vg):
    import torch
    from transformers import Gemma4ForConditionalGeneration

    model = Gemma4ForConditionalGeneration(configs()).to(torch.float32).eval()
    randomize(model, SEED, vg)
    model.save_pretrained(model_dir)
    return Gemma4ForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager").eval()


def audio_state(model):
    return {k: v for k, v in model.state_dict().items() if is_audio(k)}


def processor_expansion(mask, n_samples):
    """Gemma4Processor's own placeholder expansion and token count for the clip."""
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    me = SimpleNamespace(boa_token=MULTIMODAL[3], eoa_token=MULTIMODAL[4], audio_token=MULTIMODAL[5],
                         feature_extractor=Gemma4AudioFeatureExtractor(), audio_seq_length=750)
    text = Gemma4Processor.replace_audio_token(me, {"input_features_mask": [mask]}, 0)
    count = Gemma4Processor._compute_audio_num_tokens(me, np.zeros(n_samples), SAMPLE_RATE)
    return text, int(count)


def clamp_hooks(tower, seen):
    """Fraction of each ClippableLinear's input outside [input_min, input_max] and of its
    unclamped output outside [output_min, output_max]."""
    hooks = []
    for name, m in tower.named_modules():
        if not (hasattr(m, "linear") and hasattr(m, "input_min")):
            continue

        def pre(mod, inp, name=name):
            if not inp:
                return
            x = inp[0]
            seen.setdefault(name, {})["input"] = float(((x < mod.input_min) | (x > mod.input_max)).float().mean())

        def post(lin, inp, out, name=name, mod=m):
            seen.setdefault(name, {})["output"] = float(((out < mod.output_min) | (out > mod.output_max)).float().mean())

        hooks.append(m.register_forward_pre_hook(pre))
        hooks.append(m.linear.register_forward_hook(post))
    return hooks


def tower_stages(model, feats, mask):
    """The tower's intermediates on one clip as float32 arrays [rows, width]."""
    import torch

    tower = model.model.audio_tower
    seen, clamps = {}, {}
    first = lambda o: o[0] if isinstance(o, (tuple, list)) else o  # noqa: E731
    hooks = [
        tower.subsample_conv_projection.register_forward_hook(lambda m, i, o: seen.__setitem__("sscp", first(o))),
        tower.layers[0].register_forward_hook(lambda m, i, o: seen.__setitem__("layer0", first(o))),
        tower.output_proj.register_forward_pre_hook(lambda m, i: seen.__setitem__("encoder", i[0])),
        tower.output_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("output_proj", o)),
    ] + clamp_hooks(tower, clamps)
    x = torch.from_numpy(feats)[None]
    m = torch.from_numpy(mask)[None]
    try:
        with torch.no_grad():
            out = model.model.get_audio_features(x, m, return_dict=True)
    finally:
        for h in hooks:
            h.remove()
    valid = out.attention_mask[0].to(torch.bool)
    st = {k: seen[k][0].to(torch.float32).numpy() for k in ("sscp", "layer0", "encoder", "output_proj")}
    st["soft_tokens"] = out.pooler_output[0][valid].to(torch.float32).numpy()
    st["features"] = feats
    st["mask"] = mask.astype(np.float32)
    assert np.array_equal(st["output_proj"], out.last_hidden_state[0].to(torch.float32).numpy())
    # The embedder is RMSNorm (no weight) then Linear: recompute it from output_proj.
    y = st["output_proj"][valid.numpy()].astype(np.float64)
    y = y / np.sqrt((y * y).mean(-1, keepdims=True) + AUDIO_CFG["rms_norm_eps"])
    w = model.model.embed_audio.embedding_projection.weight.detach().to(torch.float64).numpy()
    embed_err = float(np.abs(y @ w.T - st["soft_tokens"]).max())
    return st, valid.numpy(), clamps, embed_err


def teacher_forced(model, ids, feats, mask, rows):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), input_features=torch.from_numpy(feats)[None],
                    input_features_mask=torch.from_numpy(mask)[None], use_cache=False)
    logits = out.logits[0].to(torch.float32).numpy()
    srt = np.sort(logits, axis=-1)
    return {
        "argmax": [int(a) for a in logits.argmax(-1)],
        "margin": [fx.f32(m) for m in srt[:, -1] - srt[:, -2]],
        "rows": {str(r): [fx.f32(x) for x in logits[r]] for r in rows},
    }


def gguf_reader(llama_cpp, path):
    sys.path.insert(0, str(Path(llama_cpp) / "gguf-py"))
    import gguf

    return gguf.GGUFReader(str(path))


def field_value(fld):
    v = fld.contents()
    if isinstance(v, (float, np.floating)):
        return fx.f32(v)
    return v


def softplus(x):
    return np.logaddexp(0.0, np.asarray(x, dtype=np.float64)).astype(np.float32)


def check_mmproj(llama_cpp, path, state, text_hidden):
    """The converted projector against the model: keys, and every audio tensor's name, shape,
    type and value (with the converter's transforms). `state`: the audio tower's and embedder's
    state dict as float32 numpy arrays. Returns (record, problems)."""
    r = gguf_reader(llama_cpp, path)
    keys = {k: field_value(f) for k, f in r.fields.items()
            if k.startswith(("clip.", "general.architecture", "general.type"))}
    problems = []
    for k, want in expected_mmproj_keys(text_hidden).items():
        got = keys.get(k)
        ok = (isinstance(got, float) and abs(got - want) <= 1e-12) if isinstance(want, float) else got == want
        if not ok:
            problems.append(f"key {k} = {got!r}, want {want!r}")
    tensors = {t.name: t for t in r.tensors}
    audio = {n: {"ne": [int(x) for x in t.shape], "type": t.tensor_type.name}
             for n, t in tensors.items() if n.startswith(("a.", "mm.a."))}
    seen, max_diff = set(), 0.0
    for hf, value in sorted(state.items()):
        try:
            g, transform = gguf_name(hf)
        except (KeyError, AssertionError, ValueError):
            problems.append(f"unmapped HF tensor {hf}")
            continue
        seen.add(g)
        t = tensors.get(g)
        if t is None:
            problems.append(f"missing {g} (from {hf})")
            continue
        want = softplus(value) if transform == "softplus" else np.asarray(value, dtype=np.float32)
        ne = gguf_shape(want.shape, transform)
        if [int(x) for x in t.shape] != ne:
            problems.append(f"{g}: ne {[int(x) for x in t.shape]}, want {ne}")
            continue
        if t.tensor_type.name != "F32":
            problems.append(f"{g}: type {t.tensor_type.name}, want F32")
            continue
        d = float(np.abs(np.asarray(t.data, dtype=np.float32).reshape(-1) - want.reshape(-1)).max())
        max_diff = max(max_diff, d)
        if d > (1e-6 if transform == "softplus" else 0.0):
            problems.append(f"{g}: max |gguf - hf| {d:.3g}")
    extra = sorted(set(audio) - seen)
    problems += [f"unexpected tensor {n}" for n in extra]
    rec = {"keys": keys, "audio_tensors": audio, "max_abs_diff": max_diff,
           "vision_tensors": sum(n.startswith(("v.", "mm.input")) for n in tensors), "problems": problems}
    return rec, problems


def check_text(llama_cpp, path, vg):
    r = gguf_reader(llama_cpp, path)
    names = [t.name for t in r.tensors]
    problems = [f"text GGUF holds {n}" for n in names if n.startswith(("a.", "mm.", "v."))]
    if "token_embd.weight" not in names:
        problems.append("text GGUF lacks token_embd.weight")
    try:
        vg.check_control_tokens(llama_cpp, path)
    except AssertionError as e:
        problems.append(f"control tokens: {e}")
    return {"tensors": len(names), "problems": problems}, problems


def plain(o):
    """JSON for numpy scalars and anything else odd in GGUF metadata."""
    return o.item() if hasattr(o, "item") else str(o)


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run(args, info):
    import torch
    import transformers

    vg = vision_module()
    text_hidden = info["text_hidden"]
    warnings = list(info["warnings"])
    FIXTURES.mkdir(parents=True, exist_ok=True)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory()
    model_dir = Path(args.keep) if args.keep else Path(tmp.name) / STEM
    model_dir.mkdir(parents=True, exist_ok=True)
    try:
        tok = vg.build_tokenizer(model_dir)
        # the converter reads image_mean / image_std (vision stub) from preprocessor_config.json
        from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
        Gemma4ImageProcessor().save_pretrained(model_dir)
        model = build_model(model_dir, vg)

        # our reading of the module names
        want = hf_audio_tensors(AUDIO_CFG, text_hidden)
        have = {k: tuple(v.shape) for k, v in audio_state(model).items()}
        for k in sorted(set(want) | set(have)):
            if want.get(k) != have.get(k):
                warnings.append(f"state dict {k}: expected {want.get(k)}, model has {have.get(k)}")

        text_gguf = FIXTURES / f"{STEM}.gguf"
        mmproj_gguf = FIXTURES / f"{STEM}_mmproj.gguf"
        vg.convert(args.llama_cpp, model_dir, text_gguf, mmproj=False)
        vg.convert(args.llama_cpp, model_dir, mmproj_gguf, mmproj=True)
        text_rec, p1 = check_text(args.llama_cpp, text_gguf, vg)
        state = {k: v.detach().to(torch.float32).numpy() for k, v in audio_state(model).items()}
        mm_rec, p2 = check_mmproj(args.llama_cpp, mmproj_gguf, state, text_hidden)
        warnings += p1 + p2

        record = {
            "command": COMMAND, "regenerate": REGENERATE, "transformers": transformers.__version__,
            "torch": torch.__version__, "variant": VARIANT, "seed": SEED, "text": VARIANT,
            "audio": AUDIO_CFG, "vision_stub": VISION_STUB, "clamp_range": [CLAMP_LO, CLAMP_LO + CLAMP_SPAN],
            "tokens": {"boa": BOA, "eoa": EOA, "audio": AUDIO, "pad": 0, "bos": fx.BOS},
            "gguf": {"text": {"file": text_gguf.name, "sha256": sha256(text_gguf), **text_rec},
                     "mmproj": {"file": mmproj_gguf.name, "sha256": sha256(mmproj_gguf), **mm_rec}},
            "clips": [],
        }
        lines = []
        for clip in CLIPS:
            samples, _ = read_clip(clip)
            feats, mask = features_of(samples)
            st, valid, clamps, embed_err = tower_stages(model, feats, mask)
            for stage in STAGES:
                np.save(GOLDEN / f"audio_{VARIANT}_{clip}_{stage}.npy", st[stage].astype(np.float32))
            n = int(st["soft_tokens"].shape[0])
            expansion, count = None, None
            try:
                expansion, count = processor_expansion(mask, samples.size)
            except Exception as e:   # the prompt is then built by hand below
                warnings.append(f"Gemma4Processor helpers failed ({type(e).__name__}: {e})")
            built = MULTIMODAL[3] + MULTIMODAL[5] * n + MULTIMODAL[4]
            if expansion is not None and expansion != built:
                warnings.append(f"processor expands to {expansion.count(MULTIMODAL[5])} placeholders, tower gives {n}")
            if count is not None and count != n:
                warnings.append(f"processor's _compute_audio_num_tokens = {count}, tower gives {n}")
            if embed_err > 1e-4:
                warnings.append(f"soft tokens != RMSNorm(output_proj) @ W^T: max |diff| {embed_err:.3g}")
            record["clips"].append({
                "name": clip, "file": f"{clip}.wav" if (FIXTURES / f"{clip}.wav").exists() else f"{clip}.f32.npy",
                "samples": int(samples.size), "frames": int(mask.size),
                "valid_frames": int(mask.sum()), "encoder_positions": int(valid.size), "tokens": n,
                "processor_tokens": count, "shapes": {s: list(st[s].shape) for s in STAGES},
                "clamp_fraction": {k: {kk: fx.f32(vv) for kk, vv in v.items()} for k, v in sorted(clamps.items())},
            })
            lines.append(f"{clip}: {samples.size} samples, {mask.size} frames ({int(mask.sum())} valid), "
                         f"{valid.size} encoder positions, {n} soft tokens (processor: {count})")
            for s in STAGES:
                lines.append(f"  {s:12s} {str(list(st[s].shape)):10s} {stats(st[s])}")
            fin = [v.get("input", 0.0) for v in clamps.values()]
            fout = [v.get("output", 0.0) for v in clamps.values()]
            lines.append(f"  clamps: {len(clamps)} linears, inputs clamped {min(fin):.3f}..{max(fin):.3f}, "
                         f"outputs {min(fout):.3f}..{max(fout):.3f} (fractions); embedder recomputed to {embed_err:.2g}")
            if max(fin + fout) == 0.0:
                warnings.append("no clamp bound any value")
            if clip != CLIPS[0]:
                continue

            text = PROMPT.replace(MULTIMODAL[5], built, 1)
            ids = [fx.BOS] + tok.encode(text, add_special_tokens=False)
            start = ids.index(BOA)
            if ids[start: start + n + 2] != [BOA] + [AUDIO] * n + [EOA] or ids.count(AUDIO) != n:
                raise SystemExit(f"prompt tokenized wrongly around the audio: {ids}")
            rows = sorted({0, start + 1 + n // 2, start + n + 2, len(ids) - 1})[:LOGIT_ROWS]
            tf = teacher_forced(model, ids, feats, mask, rows)
            record["prompt_text"] = text
            record["prompt"] = ids
            record["audio_positions"] = [start + 1, start + 1 + n]
            record["teacher_forced"] = tf
            margins = np.array(tf["margin"])
            lines.append(f"prompt: {len(ids)} positions, audio at [{start + 1}, {start + 1 + n}), "
                         f"{int((margins >= MIN_MARGIN).sum())} with margin >= {MIN_MARGIN}, rows {rows}")
        record["warnings"] = warnings
        (GOLDEN / f"audio_{VARIANT}.json").write_text(json.dumps(record, indent=1, default=plain) + "\n")
    finally:
        tmp.cleanup()

    written = [text_gguf, mmproj_gguf] + sorted(GOLDEN.glob(f"audio_{VARIANT}*"))
    total = sum(p.stat().st_size for p in written)
    print("=" * 20 + " audio golden summary " + "=" * 20)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, llama.cpp {args.llama_cpp}")
    print(f"text GGUF {text_gguf.stat().st_size} bytes, {text_rec['tensors']} tensors; mmproj "
          f"{mmproj_gguf.stat().st_size} bytes, {len(mm_rec['audio_tensors'])} audio tensors "
          f"(max |gguf - hf| {mm_rec['max_abs_diff']:.2g}), {mm_rec['vision_tensors']} vision")
    print("mmproj keys: " + ", ".join(f"{k.replace('clip.audio.', '')}={v}" for k, v in mm_rec["keys"].items()
                                      if k.startswith("clip.audio.")))
    for line in lines:
        print(line)
    print(f"wrote {len(written)} files, {total} bytes ({total / 1e6:.2f} MB)")
    for w in warnings[:12]:
        print(f"WARNING {w}")
    if len(warnings) > 12:
        print(f"... {len(warnings) - 12} more warnings in audio_{VARIANT}.json")
    print("audio golden: " + ("OK" if not warnings else f"{len(warnings)} WARNINGS (see above)"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", help="llama.cpp's source (convert_hf_to_gguf.py, gguf-py)")
    ap.add_argument("--dry-run", action="store_true", help="check what needs no torch; write nothing")
    ap.add_argument("--keep", help="keep the Hugging Face model directory here")
    args = ap.parse_args()
    if not args.dry_run and not args.llama_cpp:
        ap.error("--llama-cpp is required (unless --dry-run)")
    info = plan(args)
    if args.dry_run:
        print_plan(info)
        for w in info["warnings"]:
            print(f"WARNING {w}")
        print("dry run: " + ("OK" if not info["warnings"] else f"{len(info['warnings'])} WARNINGS"))
        return
    run(args, info)


if __name__ == "__main__":
    main()
