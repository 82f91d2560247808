#!/usr/bin/env python3
"""A tiny random DiffusionGemma as a GGUF fixture, with transformers' canvas logits as goldens.

Regenerate (from the repository root; under a minute on 2 CPU cores):

    python3 xtask/scripts/diffusion_gemma_fixtures.py

Requirements: torch (CPU), transformers 5.24 (`DiffusionGemmaForBlockDiffusion`), tokenizers,
numpy. See ../shared/reference/diffusion.md.

Writes
    crates/diffusion/tests/fixtures/dg_tiny.gguf          (F32 weights, written by this script)
    crates/diffusion/tests/golden/dg_tiny.json            (cases: ids, file names, summaries)
    crates/diffusion/tests/golden/dg_tiny_<case>_*.f32    (raw little-endian f32 [canvas, vocab])

The model is the 26B-A4B shape in miniature: a MoE block on every layer (dense MLP + 4
experts, top 2), V from K on the full layers with their own KV head count, a sliding window of
8, canvas 16. Every parameter is randomized (norm weights, router scales, per-expert scales
included), and the encoder's and decoder's layer scalars get different values. The GGUF
follows the keys of llama.cpp's DiffusionGemma converter (PR 24423): the Gemma 4 keys under
`diffusion-gemma.`, `diffusion.canvas_length`, `blk.N.enc_layer_output_scale`, the
`self_cond_*` tensors; `final_logit_softcapping` is left out, as that converter does.

Per case (a prompt shorter than the window and one longer), transformers (f32, eager) gives:
  * `logits`: the canvas logits with no self-conditioning (the first denoising step);
  * `sc_in`: the self-conditioning input of a second step, that step's logits over 0.8 (the
    first step's temperature), as the sampler passes them;
  * `logits_sc`: the canvas logits with that self-conditioning.
Prompts and canvases are redrawn while any router (encoder or decoder pass) has a near tie
between its k-th and (k+1)-th expert, which would flip under harmless rounding.

Replays (`golden/dg_tiny_replay.json`): transformers' own `generate` (its entropy-bound
sampler, temperature schedule, stop rule and block loop) with its randomness replaced by
given streams: `torch.multinomial` draws by inverse CDF against a given uniform per position
and step, and the sampler's `initialize_canvas` returns the given starting canvas of each block
and then each step's renoise tokens. Recorded per step: the argmax canvas, the accepted
positions, the next canvas, the mean entropy and the stop; and the generated sequence. Streams
are redrawn while any decision lies within rounding of its boundary (a uniform near a step of
the cumulative sum, an argmax near a tie, an accepted count or a stop near its threshold).
"""
import hashlib
import json
import struct
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemma4_tiny_fixtures import BOS, EMBED_RMS, VOCAB, build_tokenizer, f32, randomize  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "crates/diffusion/tests/fixtures"
GOLDEN = REPO / "crates/diffusion/tests/golden"
COMMAND = "python3 xtask/scripts/diffusion_gemma_fixtures.py"

S, F = "sliding_attention", "full_attention"
SEED = 4004
CANVAS = 16
WINDOW = 8
PROMPT_LENGTHS = {"short": 5, "long": 13}
SC_TEMPERATURE = 0.8
# A canvas and prompt route some 600 rows: a smaller gap than the text fixtures' still leaves
# three orders of magnitude above f32 rounding.
ROUTER_MIN_GAP = 0.01

TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    layer_types=[S, S, F, S, F],
    sliding_window=WINDOW,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=32,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    use_bidirectional_attention="vision",
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
# The vision tower is not used; a small one keeps the model quick to build.
VISION = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=2, head_dim=16)


def build_model():
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DiffusionGemmaTextConfig

    cfg = DiffusionGemmaConfig(text_config=DiffusionGemmaTextConfig(**TEXT), vision_config=VISION,
                               canvas_length=CANVAS)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = cfg.text_config._experts_implementation = "eager"
    torch.manual_seed(SEED)
    model = DiffusionGemmaForBlockDiffusion(cfg).to(torch.float32).eval()
    randomize(model, SEED)
    with torch.no_grad():
        # As the text fixtures' final norm: logits with a std of about 6 before the soft cap.
        model.model.decoder.norm.weight.mul_(6.0 / EMBED_RMS)
    dec, enc = model.model.decoder, model.model.encoder.language_model
    assert model.lm_head.weight.data_ptr() == dec.embed_tokens.weight.data_ptr()
    for le, ld in zip(enc.layers, dec.layers):
        assert le.router.scale.data_ptr() == ld.router.scale.data_ptr()
        assert float(le.layer_scalar) != float(ld.layer_scalar)
    return model


def canvas_logits(model, prompt, canvas, sc=None, gaps=None, **forward):
    """transformers' canvas logits [C, V]; with `gaps` (a list), appends every router's gap
    between its k-th and (k+1)-th log-probability at every row it routed; `forward`: more
    arguments of the model's forward."""
    import torch

    hooks = []
    if gaps is not None:
        def hook(mod, inp, out):
            k = mod.config.top_k_experts
            srt = torch.sort(torch.log(out[0].to(torch.float64)), dim=-1, descending=True).values
            gaps.append(float((srt[:, k - 1] - srt[:, k]).min()))
        layers = list(model.model.encoder.language_model.layers) + list(model.model.decoder.layers)
        hooks = [layer.router.register_forward_hook(hook) for layer in layers]
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([canvas]),
                        self_conditioning_logits=None if sc is None else torch.tensor(sc)[None],
                        **forward)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0].to(torch.float32).numpy()


def draw_case(model, rng, prompt_len):
    """A prompt (BOS first) and canvas with no near-tie in any router, and the three arrays."""
    import numpy as np

    for _attempt in range(1000):
        prompt = [BOS] + [int(t) for t in rng.integers(3, VOCAB, prompt_len - 1)]
        canvas = [int(t) for t in rng.integers(0, VOCAB, CANVAS)]
        gaps = []
        logits = canvas_logits(model, prompt, canvas, gaps=gaps)
        sc_in = (logits / SC_TEMPERATURE).astype(np.float32)
        logits_sc = canvas_logits(model, prompt, canvas, sc=sc_in, gaps=gaps)
        if min(gaps) >= ROUTER_MIN_GAP:
            return prompt, canvas, {"logits": logits, "sc_in": sc_in, "logits_sc": logits_sc}
    raise RuntimeError("no prompt and canvas without a router near tie")


# ---------------------------------------------------------------------------------------------
# GGUF (version 3, little-endian): only the value types and F32 tensors this fixture needs.

ALIGN = 32
T_U32, T_F32, T_BOOL, T_STRING, T_ARRAY = 4, 6, 7, 8, 9


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_value(v):
    """(type, bytes) of a metadata value: bool, int (u32), float (f32), str, or a list of one
    of those."""
    if isinstance(v, bool):
        return T_BOOL, struct.pack("<?", v)
    if isinstance(v, int):
        return T_U32, struct.pack("<I", v)
    if isinstance(v, float):
        return T_F32, struct.pack("<f", v)
    if isinstance(v, str):
        return T_STRING, gguf_string(v)
    items = [gguf_value(x) for x in v]
    elem = items[0][0] if items else T_U32
    return T_ARRAY, struct.pack("<IQ", elem, len(items)) + b"".join(b for _, b in items)


def write_gguf(path, metadata, tensors):
    """`tensors`: (name, float32 array) in file order; GGUF dims are the array's shape reversed."""
    import numpy as np

    head = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    for k, v in metadata.items():
        t, b = gguf_value(v)
        head += [gguf_string(k), struct.pack("<I", t), b]
    offset, blobs = 0, []
    for name, a in tensors:
        a = np.ascontiguousarray(a, dtype=np.float32)
        dims = list(reversed(a.shape))
        head += [gguf_string(name), struct.pack("<I", len(dims)), struct.pack(f"<{len(dims)}Q", *dims),
                 struct.pack("<IQ", 0, offset)]
        blob = a.tobytes()
        pad = (-len(blob)) % ALIGN
        blobs.append(blob + b"\0" * pad)
        offset += len(blob) + pad
    head = b"".join(head)
    head += b"\0" * ((-len(head)) % ALIGN)
    path.write_bytes(head + b"".join(blobs))


def tokenizer_metadata(hf):
    """The Gemma 4 BPE keys of the tiny tokenizer (as llama.cpp's converter writes them)."""
    j = json.loads(hf.backend_tokenizer.to_str())
    vocab = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {a["content"] for a in j["added_tokens"]}
    tokens = [t for t, _ in vocab]
    types = [3 if t in specials else 6 if t.startswith("<0x") else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return {
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * len(tokens),
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.ggml.add_bos_token": True,
    }


def model_metadata(model):
    t = model.config.text_config
    arch = "diffusion-gemma"
    full = [lt == F for lt in t.layer_types]
    kv = [TEXT["num_global_key_value_heads"] if f else TEXT["num_key_value_heads"] for f in full]
    g = TEXT["global_head_dim"]
    return {
        "general.architecture": arch,
        "general.type": "model",
        "general.name": "DiffusionGemma tiny random",
        f"{arch}.block_count": t.num_hidden_layers,
        f"{arch}.context_length": t.max_position_embeddings,
        f"{arch}.embedding_length": t.hidden_size,
        f"{arch}.feed_forward_length": t.intermediate_size,
        f"{arch}.attention.head_count": t.num_attention_heads,
        f"{arch}.attention.head_count_kv": kv,
        f"{arch}.attention.key_length": g,
        f"{arch}.attention.value_length": g,
        f"{arch}.attention.key_length_swa": TEXT["head_dim"],
        f"{arch}.attention.value_length_swa": TEXT["head_dim"],
        f"{arch}.attention.sliding_window": t.sliding_window,
        f"{arch}.attention.sliding_window_pattern": [not f for f in full],
        f"{arch}.attention.layer_norm_rms_epsilon": float(t.rms_norm_eps),
        f"{arch}.attention.shared_kv_layers": 0,
        f"{arch}.attention.causal": False,
        f"{arch}.embedding_length_per_layer_input": 0,
        f"{arch}.rope.freq_base": 1_000_000.0,
        f"{arch}.rope.freq_base_swa": 10_000.0,
        f"{arch}.rope.dimension_count": g,
        f"{arch}.rope.dimension_count_swa": TEXT["head_dim"],
        f"{arch}.expert_count": t.num_experts,
        f"{arch}.expert_used_count": t.top_k_experts,
        f"{arch}.expert_feed_forward_length": t.moe_intermediate_size,
        "diffusion.canvas_length": CANVAS,
        "diffusion.eb_max_steps": 12,
        "diffusion.eb_t_min": 0.4,
        "diffusion.eb_t_max": 0.8,
        "diffusion.eb_entropy_bound": 0.1,
        "diffusion.eb_stability_threshold": 1,
        "diffusion.eb_confidence_threshold": 0.005,
    }


def model_tensors(model):
    """(GGUF name, array) for every tensor, from the decoder's weights (the encoder shares them)
    and both sets of layer scalars."""
    import numpy as np

    dec, enc = model.model.decoder, model.model.encoder.language_model
    a = lambda p: p.detach().to("cpu").numpy().astype(np.float32)  # noqa: E731
    # Proportional RoPE on the full layers: a quarter of the pairs rotate, the rest are frozen
    # by a huge frequency divisor (llama.cpp's `rope_freqs`).
    pairs = TEXT["global_head_dim"] // 2
    turning = pairs // 4
    rope_freqs = np.array([1.0] * turning + [1e30] * (pairs - turning), dtype=np.float32)
    out = [("token_embd.weight", a(dec.embed_tokens.weight)), ("rope_freqs.weight", rope_freqs),
           ("output_norm.weight", a(dec.norm.weight))]
    sc = dec.self_conditioning
    out += [("self_cond_pre_norm.weight", a(sc.pre_norm.weight)), ("self_cond_gate.weight", a(sc.gate_proj.weight)),
            ("self_cond_up.weight", a(sc.up_proj.weight)), ("self_cond_down.weight", a(sc.down_proj.weight))]
    for il, (ld, le) in enumerate(zip(dec.layers, enc.layers)):
        at = ld.self_attn
        b = f"blk.{il}."
        out += [(b + "attn_norm.weight", a(ld.input_layernorm.weight)),
                (b + "attn_q.weight", a(at.q_proj.weight)), (b + "attn_k.weight", a(at.k_proj.weight))]
        if at.v_proj is not None:
            out.append((b + "attn_v.weight", a(at.v_proj.weight)))
        out += [(b + "attn_output.weight", a(at.o_proj.weight)),
                (b + "attn_q_norm.weight", a(at.q_norm.weight)), (b + "attn_k_norm.weight", a(at.k_norm.weight)),
                (b + "post_attention_norm.weight", a(ld.post_attention_layernorm.weight)),
                (b + "ffn_norm.weight", a(ld.pre_feedforward_layernorm.weight)),
                (b + "ffn_gate.weight", a(ld.mlp.gate_proj.weight)), (b + "ffn_up.weight", a(ld.mlp.up_proj.weight)),
                (b + "ffn_down.weight", a(ld.mlp.down_proj.weight)),
                (b + "post_ffw_norm.weight", a(ld.post_feedforward_layernorm.weight)),
                (b + "pre_ffw_norm_2.weight", a(ld.pre_feedforward_layernorm_2.weight)),
                (b + "post_ffw_norm_1.weight", a(ld.post_feedforward_layernorm_1.weight)),
                (b + "post_ffw_norm_2.weight", a(ld.post_feedforward_layernorm_2.weight)),
                (b + "ffn_gate_inp.weight", a(ld.router.proj.weight)), (b + "ffn_gate_inp.scale", a(ld.router.scale)),
                (b + "ffn_gate_up_exps.weight", a(ld.experts.gate_up_proj)),
                (b + "ffn_down_exps.weight", a(ld.experts.down_proj)),
                (b + "ffn_down_exps.scale", a(ld.router.per_expert_scale)),
                (b + "layer_output_scale.weight", a(ld.layer_scalar)),
                (b + "enc_layer_output_scale.weight", a(le.layer_scalar))]
    return out


# ---------------------------------------------------------------------------------------------
# Sampler replays

REPLAYS = {
    # One block run to its last step: a loose bound accepts several positions a step.
    "one_block": dict(prompt_len=5, blocks=1, steps=6, entropy_bound=1.5, stability_threshold=1,
                      confidence_threshold=0.005),
    # Two blocks (the second's prompt passes the window), each stopped early by the confidence
    # alone (a random model's argmax canvas never settles, so no stability is asked for).
    "two_blocks": dict(prompt_len=5, blocks=2, steps=8, entropy_bound=3.0, stability_threshold=0,
                       confidence_threshold=0.9),
}
# Self-conditioning feeds each step's logits to the next, and a random model amplifies
# rounding from step to step: transformers' own two expert implementations (grouped products
# and the eager loop) differ by 7e-3 in a step's mean entropy by the sixth step here. Decisions
# closer than these to their boundary are redrawn: a uniform to a step of the cumulative sum,
# the top two probabilities, the entropy before a position to the bound, the mean entropy to
# the confidence threshold.
CDF_MARGIN = 2e-4
ARGMAX_MARGIN = 1e-3
ENTROPY_MARGIN = 5e-3


def replay(model, rng, spec):
    """transformers' generate with given streams; None if a decision was within its margin."""
    import numpy as np
    import torch
    from transformers.models.diffusion_gemma import generation_diffusion_gemma as gen

    blocks, steps = spec["blocks"], spec["steps"]
    prompt = [BOS] + [int(t) for t in rng.integers(3, VOCAB, spec["prompt_len"] - 1)]
    canvases = rng.integers(0, VOCAB, (blocks, CANVAS))
    uniforms = rng.random((blocks * steps, CANVAS), dtype=np.float32)
    renoise = rng.integers(0, VOCAB, (blocks * steps, CANVAS))
    state = {"canvas": 0, "step": 0, "renoise": 0, "close": False, "need_canvas": True}
    records = []

    def fake_multinomial(probs, num_samples):
        u = torch.tensor(uniforms[state["step"]], dtype=torch.float64)
        cdf = torch.cumsum(probs.to(torch.float64), dim=-1)
        idx = torch.searchsorted(cdf, u[:, None], right=True).clamp(max=probs.shape[-1] - 1)
        hi = cdf.gather(-1, idx)
        lo = torch.where(idx > 0, cdf.gather(-1, (idx - 1).clamp(min=0)), torch.zeros_like(hi))
        if ((hi - u[:, None]).abs().min() < CDF_MARGIN) or ((u[:, None] - lo).abs().min() < CDF_MARGIN):
            state["close"] = "cdf"
        return idx

    def fake_initialize(self, batch_size, device):
        if state["need_canvas"]:
            row = canvases[state["canvas"]]
            state["canvas"] += 1
            state["need_canvas"] = False
        else:
            row = renoise[state["renoise"]]
            state["renoise"] += 1
        return torch.tensor(row[None], dtype=torch.long)

    original_step = gen.DiffusionGemmaGenerationMixin._denoising_step

    def recording_step(self, **kw):
        sampler = kw["sampler"]
        out = original_step(self, **kw)
        nxt, argmax, processed, finished = out
        p = torch.softmax(processed[0].to(torch.float64), dim=-1)
        h = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
        srt = torch.sort(p, dim=-1, descending=True).values
        if (srt[:, 0] - srt[:, 1]).min() < ARGMAX_MARGIN:
            state["close"] = "argmax"
        hs = torch.sort(h).values
        before = torch.cumsum(hs, 0) - hs
        if (before - spec["entropy_bound"]).abs().min() < ENTROPY_MARGIN:
            state["close"] = "accept"
        mean = float(h.mean())
        if abs(mean - spec["confidence_threshold"]) < ENTROPY_MARGIN:
            state["close"] = "mean"
        records.append({
            "block": state["canvas"] - 1,
            "argmax": [int(t) for t in argmax[0]],
            "accepted": [int(a) for a in sampler.accepted_token_mask[0]],
            "next_canvas": [int(t) for t in nxt[0]],
            "mean_entropy": f32(mean),
            "done": bool(finished[0]),
        })
        state["step"] += 1
        return out

    def new_block_hook(*a, **k):
        state["need_canvas"] = True
        return original_prepare(*a, **k)

    def router_hook(mod, inp, out):
        k = mod.config.top_k_experts
        srt = torch.sort(torch.log(out[0].to(torch.float64)), dim=-1, descending=True).values
        if float((srt[:, k - 1] - srt[:, k]).min()) < ROUTER_MIN_GAP:
            state["close"] = "router"

    layers = list(model.model.encoder.language_model.layers) + list(model.model.decoder.layers)
    hooks = [layer.router.register_forward_hook(router_hook) for layer in layers]
    original_prepare = gen.DiffusionGemmaGenerationMixin._prepare_denoiser_inputs
    saved = (torch.multinomial, gen.EntropyBoundSampler.initialize_canvas)
    torch.multinomial = fake_multinomial
    gen.EntropyBoundSampler.initialize_canvas = fake_initialize
    gen.DiffusionGemmaGenerationMixin._denoising_step = recording_step
    gen.DiffusionGemmaGenerationMixin._prepare_denoiser_inputs = new_block_hook
    try:
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([prompt]), max_new_tokens=blocks * CANVAS,
                max_denoising_steps=steps, t_min=0.4, t_max=0.8,
                sampler_config=gen.EntropyBoundSamplerConfig(entropy_bound=float(spec["entropy_bound"])),
                stability_threshold=spec["stability_threshold"],
                confidence_threshold=float(spec["confidence_threshold"]),
                eos_token_id=None, pad_token_id=0)
    finally:
        for h in hooks:
            h.remove()
        torch.multinomial, gen.EntropyBoundSampler.initialize_canvas = saved
        gen.DiffusionGemmaGenerationMixin._denoising_step = original_step
        gen.DiffusionGemmaGenerationMixin._prepare_denoiser_inputs = original_prepare
    if state["close"]:
        return None
    seq = out.sequences if hasattr(out, "sequences") else out
    return {
        "prompt": prompt,
        "steps": steps,
        "entropy_bound": spec["entropy_bound"],
        "t_min": 0.4, "t_max": 0.8, "stability_threshold": spec["stability_threshold"],
        "confidence_threshold": spec["confidence_threshold"],
        "canvases": canvases.tolist(),
        "uniforms": [[f32(u) for u in row] for row in uniforms[:state["step"]]],
        "renoise": renoise[:state["step"]].tolist(),
        "records": records,
        "generated": [int(t) for t in seq[0, len(prompt):]],
    }


def replays(model):
    import numpy as np

    rng = np.random.default_rng(SEED + 2)
    out = {}
    for name, spec in REPLAYS.items():
        for _attempt in range(1000):
            r = replay(model, rng, spec)
            if r is not None:
                out[name] = r
                break
        else:
            raise RuntimeError(f"{name}: every replay had a decision within rounding")
    return out


def main():
    import numpy as np
    import tokenizers
    import torch
    import transformers

    FIXTURES.mkdir(parents=True, exist_ok=True)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    model = build_model()
    with tempfile.TemporaryDirectory() as tmp:
        hf_tok = build_tokenizer(tmp)
    gguf = FIXTURES / "dg_tiny.gguf"
    meta = model_metadata(model)
    meta.update(tokenizer_metadata(hf_tok))
    write_gguf(gguf, meta, model_tensors(model))

    rng = np.random.default_rng(SEED + 1)
    cases = []
    for case, n in PROMPT_LENGTHS.items():
        prompt, canvas, arrays = draw_case(model, rng, n)
        files = {}
        for kind, arr in arrays.items():
            name = f"dg_tiny_{case}_{kind}.f32"
            (GOLDEN / name).write_bytes(np.ascontiguousarray(arr, dtype="<f4").tobytes())
            files[kind] = name
        cases.append({
            "name": case, "prompt": prompt, "canvas": canvas, "files": files,
            "argmax": [int(i) for i in arrays["logits"].argmax(-1)],
            "argmax_sc": [int(i) for i in arrays["logits_sc"].argmax(-1)],
        })
    golden = {
        "command": COMMAND,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "numpy": np.__version__},
        "gguf_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
        "canvas_length": CANVAS, "vocab": VOCAB, "sliding_window": WINDOW,
        "sc_temperature": SC_TEMPERATURE,
        "cases": cases,
    }
    (GOLDEN / "dg_tiny.json").write_text(json.dumps(golden, indent=1) + "\n")
    runs = replays(model)
    (GOLDEN / "dg_tiny_replay.json").write_text(
        json.dumps({"command": COMMAND, "versions": golden["versions"], "runs": runs}) + "\n")
    for name, r in runs.items():
        steps = [(rec["block"], sum(rec["accepted"]), rec["done"]) for rec in r["records"]]
        print(f"replay {name}: (block, accepted, done) per step {steps}")
    print(f"wrote {gguf} ({gguf.stat().st_size} bytes) and {len(cases)} cases")


if __name__ == "__main__":
    main()
