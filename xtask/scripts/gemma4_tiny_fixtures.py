#!/usr/bin/env python3
"""Tiny random Gemma 4 text models as GGUF fixtures, with golden logits from two references.

Regenerate everything (from the repository root; takes about a minute on 2 CPU cores):

    python3 xtask/scripts/gemma4_tiny_fixtures.py --llama-cpp /work/dl/llama.cpp \\
        --llama-cpp-py /work/dl/llama_cpp_py

Requirements: torch (CPU), transformers 5.23 (Gemma4TextConfig / Gemma4ForCausalLM), tokenizers,
numpy; a llama.cpp checkout with a CPU build in LLAMA_CPP/build/bin (its `convert_hf_to_gguf.py`,
`gguf-py`, `llama-tokenize` and shared libraries are used) and the llama-cpp-python package
source (the `llama_cpp/` ctypes bindings) in LLAMA_CPP_PY. See ../shared/ENVIRONMENT.md.

Writes
    crates/gemma4-text/tests/fixtures/gemma4_tiny_{e2b,moe,dense}.gguf   (F32 weights)
    crates/gemma4-text/tests/golden/gemma4_tiny_{e2b,moe,dense}.json
    crates/gemma4-text/tests/golden/gemma4_tiny_tokenizer.json

Each model is built with a fixed seed, every parameter (norm weights, `layer_scalar`, router
`scale` and `per_expert_scale` included) is randomized, saved as a Hugging Face model directory
(with a tiny byte-fallback BPE tokenizer of the same vocabulary size) and converted with
llama.cpp's `convert_hf_to_gguf.py --outtype f32`. The goldens hold, for 3 fixed token sequences
per model (BOS first, ids chosen directly, no tokenizer):
  * transformers (float32, eager attention, no KV cache): argmax and max logit at every
    position, plus the full logits row at the first, middle and last position;
  * llama.cpp (CPU, F32 KV cache, no flash attention, teacher-forced in one batch) on the
    written GGUF: argmax and max logit at every position;
  * the agreement between the two (top-1 agreement, max |logit difference| over all rows).
The e2b GGUF also gets a tokenizer check (10 strings through the HF tokenizer and through
llama.cpp's `llama-tokenize`).

Numerics: ggml's CPU GELU rounds its input to f16 and reads an f16 table (GGML_GELU_FP16), so
llama.cpp differs from transformers by a few 1e-3 relative; the golden records the difference
also against transformers with that GELU emulated. Sequences are chosen so that no position is
a near tie (top-1 margin, MoE top-k router gap), which keeps argmax comparisons meaningful.

Internal: `--llamacpp-eval GGUF IN.json` is the worker mode the script runs in a subprocess
(with LLAMA_CPP_LIB_PATH / PYTHONPATH set) so that llama.cpp and torch never share a process.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "crates/gemma4-text/tests/fixtures"
GOLDEN = REPO / "crates/gemma4-text/tests/golden"
COMMAND = ("python3 xtask/scripts/gemma4_tiny_fixtures.py --llama-cpp /work/dl/llama.cpp "
           "--llama-cpp-py /work/dl/llama_cpp_py")

VOCAB = 512
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]   # ids 0..5
BYTE_TOKENS = [f"<0x{i:02X}>" for i in range(256)]                         # ids 6..261
BOS = 2

S, F = "sliding_attention", "full_attention"

# Common to all variants. rope_parameters is left at its default: sliding layers "default"
# (theta 1e4), full layers "proportional" (partial_rotary_factor 0.25, theta 1e6).
COMMON = dict(
    vocab_size=VOCAB,
    vocab_size_per_layer_input=VOCAB,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    sliding_window=8,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)

VARIANTS = {
    # E2B-like: per-layer embeddings, KV sharing over the last 2 layers, double-wide MLP there.
    # L_kv = 7 - 2 = 5: layer 4 is full and layer 3 sliding, so llama.cpp's donor rule
    # (swa -> L_kv-2, full -> L_kv-1) equals HF's (last non-shared layer of the same type), and
    # the shared tail [S, F] repeats the pattern of layers 3, 4.
    "e2b": dict(
        seed=1001,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=7,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        layer_types=[S, F, S, S, F, S, F],
        hidden_size_per_layer_input=8,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        attention_k_eq_v=False,
        enable_moe_block=False,
    ),
    # 26B-A4B-like: MoE block on every layer (dense MLP + 4 experts, top 2), K=V on full layers
    # with their own KV head count; no PLE, no KV sharing.
    "moe": dict(
        seed=2002,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        layer_types=[S, S, F, S, S, F],
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=32,
    ),
    # 31B-like plain dense model with GQA (4 query heads over 2 KV heads).
    "dense": dict(
        seed=3003,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=64,
        layer_types=[S, S, F, S, F],
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        attention_k_eq_v=False,
        enable_moe_block=False,
    ),
}

SEQ_LENGTHS = [20, 25, 30]
# Sequences are drawn token by token, redrawing a token while the transformers logits at its
# position have a top-1 margin below MIN_TOP1_MARGIN, or (MoE) while any layer's top-k expert
# choice there is a near tie (k-th and (k+1)-th router logits closer than ROUTER_MIN_GAP):
# such positions flip under harmless rounding differences.
MIN_TOP1_MARGIN = 0.15
ROUTER_MIN_GAP = 0.05
EMBED_RMS = 0.4

# Training text for the tiny BPE. The tokenizer is trained with a newline-run pre-tokenizer
# (so no merge crosses a newline, as in the real Gemma 4 vocabulary, which llama.cpp's
# "[^\n]+|[\n]+" split relies on); the saved tokenizer.json has NO pre-tokenizer, like Gemma 4's.
CORPUS = """The quick brown fox jumps over the lazy dog. A small model runs in the browser and answers questions.
Hello world! Hello there, how are you today? I am fine, thank you, and you?
Once upon a time, in a small village by the sea, there lived an old fisherman and his wife.
They lived together in a little hut on the shore, and every morning the man went out to fish.
The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.
In mathematics, a prime number is a natural number greater than one that is not a product of two smaller numbers.
The three primary colors are red, yellow and blue; mixing them gives orange, green and purple.
def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

for i in range(10):
    print(i, fibonacci(i))


user
What is the boiling point of water?
model
Water boils at one hundred degrees Celsius at sea level.
user
Write a haiku about autumn.
model
Red leaves drift and fall, the cold wind sings in the trees, winter is coming.
Die Hauptstadt von Deutschland ist Berlin. Les enfants jouent dans le jardin. El perro come la comida.
1, 2, 3, 4, 5, 6, 7, 8, 9, 10. 2 + 2 = 4. 3 * 7 = 21. 100 - 58 = 42.
Attention is computed from queries, keys and values; the keys and values are stored in a cache.
Every layer normalizes its input, attends over previous tokens, and then applies a feed forward network.
Sliding window layers only look at recent tokens, while global layers look at the whole context.
The tokenizer splits text into pieces; unknown characters fall back to their bytes.
"""

TOKENIZER_STRINGS = [
    "Hello world!",
    "hello  world",
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    return n\n",
    "<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n",
    "Ünïcödé ♥ 日本語 👋",
    "   leading spaces and trailing   ",
    "\n\n\nnewlines\n\nand\ttabs\t\t",
    "1, 2, 3, 4, 5. 100 - 58 = 42",
    "Les enfants jouent dans le jardin.",
]


def f32(x):
    """A float rounded to float32 and printed with 9 significant digits (round-trips f32)."""
    return float(f"{float(x):.9g}")


# ---------------------------------------------------------------------------------------------
# Tokenizer


def build_tokenizer(out_dir, extra_specials=()):
    """The tiny BPE; `extra_specials` (already in SPECIALS) are also marked special, so the
    converter writes them as control tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=True, fuse_unk=False))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("\n+"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS + BYTE_TOKENS, show_progress=False)
    tok.train_from_iterator([CORPUS], trainer)

    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = None
    # Only the real special tokens are "added tokens"; the <0xXX> byte tokens stay plain vocab
    # entries (the trainer registered them as added specials).
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in SPECIALS]
    vocab = j["model"]["vocab"]
    assert len(vocab) == VOCAB, len(vocab)
    for i, s in enumerate(SPECIALS + BYTE_TOKENS):
        assert vocab[s] == i, (s, vocab[s], i)
    assert len(j["model"]["merges"]) > 0
    tok = Tokenizer.from_str(json.dumps(j))

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>",
        extra_special_tokens=["<|turn>", "<turn|>"] + list(extra_specials),
        add_bos_token=False, add_eos_token=False,
    )
    hf.save_pretrained(out_dir)
    assert len(hf) == VOCAB
    return hf


# ---------------------------------------------------------------------------------------------
# Models


def config_kwargs(name):
    kw = dict(COMMON)
    kw.update({k: v for k, v in VARIANTS[name].items() if k != "seed"})
    return kw


def randomize(model, seed):
    """Deterministically overwrite every parameter and the layer_scalar buffers."""
    import torch

    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    for name in sorted(params):
        p = params[name]
        with torch.no_grad():
            leaf = name.rsplit(".", 1)[-1] if not name.endswith(".weight") else name.rsplit(".", 2)[-2]
            if p.dim() == 1:
                if leaf in ("q_norm", "k_norm"):
                    # these carry the attention scale (scaling = 1.0): keep q.k moderate, which
                    # also keeps the random network from amplifying rounding differences
                    v = 0.4 + 0.1 * torch.randn(p.shape, generator=g)
                elif name.endswith("per_expert_scale"):
                    v = 0.5 + torch.rand(p.shape, generator=g)
                elif name == "model.norm.weight":
                    # final norm: with the embedding scale below, logits have a std of about 6
                    # before the soft cap at 30
                    v = (6.0 / EMBED_RMS) * (1.0 + 0.15 * torch.randn(p.shape, generator=g))
                else:   # RMSNorm weights, router.scale
                    v = 1.0 + 0.3 * torch.randn(p.shape, generator=g)
            elif name.endswith("embed_tokens_per_layer.weight"):
                v = 0.3 * torch.randn(p.shape, generator=g)
            elif name.endswith("embed_tokens.weight"):
                # input embeddings (times sqrt(hidden)) have an RMS of EMBED_RMS, below what the
                # layers add, so that with the tied LM head the argmax does not just copy the
                # input token
                v = (EMBED_RMS / p.shape[1] ** 0.5) * torch.randn(p.shape, generator=g)
            elif name.endswith("router.proj.weight"):
                # the router input is already scaled by hidden**-0.5: router logits std about 2
                v = 2.0 * torch.randn(p.shape, generator=g)
            else:
                fan_in = p.shape[-1]       # nn.Linear [out, in]; experts [E, out, in]
                v = torch.randn(p.shape, generator=g) / fan_in ** 0.5
            p.copy_(v.to(torch.float32))
    for name, b in sorted(model.named_buffers()):
        if name.endswith("layer_scalar"):
            with torch.no_grad():
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return model


def build_model(name, out_dir):
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    kw = config_kwargs(name)
    cfg = Gemma4TextConfig(**kw)
    torch.manual_seed(VARIANTS[name]["seed"])
    model = Gemma4ForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, VARIANTS[name]["seed"])
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(out_dir)
    return kw


def load_model(model_dir):
    import torch
    from transformers import Gemma4ForCausalLM

    return Gemma4ForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager").eval()


def hf_logits(model, tokens, router_gaps=None):
    """transformers logits [T, V]. With router_gaps (a list), appends for every MoE layer the
    gap between the k-th and (k+1)-th router logits at every position (an array [T])."""
    import torch

    hooks = []
    if router_gaps is not None:
        def hook(mod, inp, out):
            probs = out[0].to(torch.float64)
            k = mod.config.top_k_experts
            srt = torch.sort(torch.log(probs), dim=-1, descending=True).values
            router_gaps.append((srt[:, k - 1] - srt[:, k]).numpy())
        for layer in model.model.layers:
            if getattr(layer, "enable_moe_block", False):
                hooks.append(layer.router.register_forward_hook(hook))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([tokens]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0].to(torch.float32).numpy()


def top1_margin(row):
    import numpy as np

    srt = np.sort(row)
    return float(srt[-1] - srt[-2])


def sequences(name, model):
    """3 token sequences: BOS, then random ids in [3, VOCAB), drawn one at a time and redrawn
    while the new position is ambiguous (see MIN_TOP1_MARGIN / ROUTER_MIN_GAP)."""
    import numpy as np

    rng = np.random.default_rng(VARIANTS[name]["seed"] + 7)
    out = []
    for n in SEQ_LENGTHS:
        s = [BOS]
        while len(s) < n:
            for _attempt in range(1000):
                cand = s + [int(rng.integers(3, VOCAB))]
                gaps = []
                logits = hf_logits(model, cand, gaps)
                if (top1_margin(logits[-1]) >= MIN_TOP1_MARGIN
                        and all(g[-1] >= ROUTER_MIN_GAP for g in gaps)):
                    s = cand
                    break
            else:
                raise RuntimeError(f"{name}: no unambiguous token at position {len(s)}")
        out.append(s)
    return out


def gelu_fp16_lut(model):
    """Make every GELU behave like ggml's CPU one (GGML_GELU_FP16: input rounded to f16, output
    looked up in an f16 table, |x| >= 10 passed through / zeroed). Diagnostic only."""
    import torch

    class GeluF16(torch.nn.Module):
        def forward(self, x):
            xh = x.to(torch.float16).to(torch.float32)
            y = torch.nn.functional.gelu(xh, approximate="tanh").to(torch.float16).to(torch.float32)
            y = torch.where(x <= -10.0, torch.zeros_like(x), y)
            return torch.where(x >= 10.0, x, y)

    for mod in list(model.modules()):
        if hasattr(mod, "act_fn"):
            mod.act_fn = GeluF16()
    return model


# ---------------------------------------------------------------------------------------------
# llama.cpp


def llama_env(args):
    env = dict(os.environ)
    env["LLAMA_CPP_LIB_PATH"] = str(Path(args.llama_cpp) / "build/bin")
    env["PYTHONPATH"] = str(args.llama_cpp_py)
    return env


def convert(args, model_dir, out_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(args.llama_cpp) / "gguf-py")
    subprocess.run([sys.executable, str(Path(args.llama_cpp) / "convert_hf_to_gguf.py"), str(model_dir),
                    "--outtype", "f32", "--outfile", str(out_path)],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def llamacpp_eval_worker(gguf_path, in_json):
    """Runs inside a subprocess: teacher-forced logits for every sequence, one batch each."""
    import numpy as np
    import llama_cpp

    seqs = json.loads(Path(in_json).read_text())
    n_ctx = max(len(s) for s in seqs) + 8
    llm = llama_cpp.Llama(model_path=gguf_path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                          n_threads=2, logits_all=True, verbose=False, seed=0,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    out = []
    for s in seqs:
        llm.reset()
        llm.eval(s)
        out.append(np.array(llm.scores[:len(s)], dtype=np.float32).tolist())
    json.dump(out, sys.stdout)


def llamacpp_logits(args, gguf_path, seqs):
    import numpy as np

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(seqs, f)
    try:
        r = subprocess.run([sys.executable, __file__, "--llamacpp-eval", str(gguf_path), f.name],
                           env=llama_env(args), capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"llama.cpp worker failed ({r.returncode}):\n{r.stderr}")
    finally:
        os.unlink(f.name)
    return [np.array(x, dtype=np.float32) for x in json.loads(r.stdout)]


def llamacpp_tokenize(args, gguf_path, text):
    exe = Path(args.llama_cpp) / "build/bin/llama-tokenize"
    r = subprocess.run([str(exe), "-m", str(gguf_path), "--stdin", "--no-escape", "--ids", "--log-disable",
                        "--no-bos"], input=text.encode(), capture_output=True, check=True)
    line = [l for l in r.stdout.decode().splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def gguf_summary(path, llama_cpp):
    sys.path.insert(0, str(Path(llama_cpp) / "gguf-py"))
    import gguf

    rd = gguf.GGUFReader(str(path))
    meta = {}
    for k, fld in rd.fields.items():
        if k.startswith("GGUF."):
            continue
        if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                 "tokenizer.ggml.merges"):
            meta[k] = {"type": f"ARRAY[{gguf.GGUFValueType(fld.types[1]).name}]", "len": len(fld.data)}
            continue
        v = fld.contents()
        if isinstance(v, float):
            v = f32(v)
        elif isinstance(v, list):
            v = [f32(x) if isinstance(x, float) else x for x in v]
        types = [gguf.GGUFValueType(t).name for t in fld.types]
        meta[k] = {"type": types[0] if len(types) == 1 else f"{types[0]}[{types[1]}]", "value": v}
    # shape in GGUF order (ne0 first, as llama.cpp prints it)
    tensors = {t.name: {"shape": [int(x) for x in t.shape], "type": t.tensor_type.name} for t in rd.tensors}
    return meta, tensors


# ---------------------------------------------------------------------------------------------


def versions(args):
    import tokenizers
    import torch
    import transformers

    import re

    rev = subprocess.run(["git", "-C", str(args.llama_cpp), "rev-parse", "HEAD"], capture_output=True, text=True)
    init = Path(args.llama_cpp_py) / "llama_cpp/__init__.py"
    m = re.search(r'__version__ = "([^"]+)"', init.read_text()) if init.exists() else None
    libs = sorted(p.name for p in (Path(args.llama_cpp) / "build/bin").glob("libggml.so.*.*.*"))
    desc = (f"git {rev.stdout.strip()}" if rev.returncode == 0 else
            f"vendored in the llama-cpp-python {m.group(1) if m else '?'} sdist")
    desc += f", CPU build ({libs[-1] if libs else 'ggml ?'})"
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "llama.cpp": desc,
    }


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_variant(args, name, work, vers):
    import numpy as np

    model_dir = work / f"gemma4_tiny_{name}"
    model_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(model_dir)
    kw = build_model(name, model_dir)
    gguf_path = FIXTURES / f"gemma4_tiny_{name}.gguf"
    convert(args, model_dir, gguf_path)

    model = load_model(model_dir)
    seqs = sequences(name, model)
    router_gaps = []
    hf = [hf_logits(model, s, router_gaps) for s in seqs]
    lc = llamacpp_logits(args, gguf_path, seqs)
    hf16 = [hf_logits(gelu_fp16_lut(load_model(model_dir)), s) for s in seqs]
    max_abs16 = max(float(np.abs(a - b).max()) for a, b in zip(hf16, lc))

    cases = []
    agree = total = copies = 0
    max_abs = 0.0
    max_rel = 0.0
    min_margin = float("inf")
    for s, h, l in zip(seqs, hf, lc):
        assert h.shape == l.shape == (len(s), VOCAB), (h.shape, l.shape)
        d = np.abs(h - l)
        max_abs = max(max_abs, float(d.max()))
        max_rel = max(max_rel, float((d.max(axis=1) / np.abs(h).max(axis=1)).max()))
        srt = np.sort(h, axis=1)
        margins = srt[:, -1] - srt[:, -2]
        min_margin = min(min_margin, float(margins.min()))
        agree += int((h.argmax(1) == l.argmax(1)).sum())
        copies += int((h.argmax(1) == np.array(s)).sum())
        total += len(s)
        n = len(s)
        rows = sorted({0, n // 2, n - 1})
        cases.append({
            "tokens": s,
            "hf": {
                "argmax": [int(x) for x in h.argmax(1)],
                "max_logit": [f32(x) for x in h.max(1)],
                "top1_margin": [f32(x) for x in margins],
                "full_rows": {str(p): [f32(x) for x in h[p]] for p in rows},
            },
            "llama_cpp": {
                "argmax": [int(x) for x in l.argmax(1)],
                "max_logit": [f32(x) for x in l.max(1)],
            },
            "max_abs_diff": f32(d.max()),
        })

    cfg_json = json.loads((model_dir / "config.json").read_text())
    meta, tensors = gguf_summary(gguf_path, args.llama_cpp)
    agreement = {"top1_agree": agree, "positions": total, "max_abs_logit_diff": f32(max_abs),
                 "max_rel_logit_diff": f32(max_rel), "hf_min_top1_margin": f32(min_margin),
                 "max_abs_logit_diff_hf_with_ggml_fp16_gelu": f32(max_abs16),
                 "hf_argmax_equals_input_token": copies}
    if router_gaps:
        agreement["hf_min_router_topk_logit_gap"] = f32(min(float(g.min()) for g in router_gaps))
    golden = {
        "model": f"gemma4_tiny_{name}",
        "gguf": f"crates/gemma4-text/tests/fixtures/gemma4_tiny_{name}.gguf",
        "gguf_sha256": sha256(gguf_path),
        "command": COMMAND,
        "versions": vers,
        "seed": VARIANTS[name]["seed"],
        "config_kwargs": kw,
        "hf_config": cfg_json,
        "notes": ("hf = transformers Gemma4ForCausalLM float32, eager attention, use_cache=False; "
                  "llama_cpp = llama.cpp CPU, 2 threads, F32 KV cache, flash attention off, whole sequence "
                  "in one batch, logits_all. "
                  "full_rows: complete logits rows (after final_logit_softcapping) keyed by position. "
                  "top1_margin: hf top-1 minus top-2 logit (argmax comparisons are only meaningful "
                  "where it exceeds the implementation's error). ggml's CPU GELU goes through an f16 "
                  "table, which explains most of the hf/llama.cpp difference "
                  "(agreement.max_abs_logit_diff_hf_with_ggml_fp16_gelu)."),
        "agreement": agreement,
        "gguf_metadata": meta,
        "gguf_tensors": tensors,
        "cases": cases,
    }
    (GOLDEN / f"gemma4_tiny_{name}.json").write_text(json.dumps(golden, indent=1) + "\n")
    return {"agreement": agreement, "meta": meta, "tensors": tensors, "size": gguf_path.stat().st_size,
            "model_dir": model_dir}


def tokenizer_check(args, model_dir, gguf_path, vers):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    cases = []
    for s in TOKENIZER_STRINGS:
        hf = tok(s, add_special_tokens=False)["input_ids"]
        lc = llamacpp_tokenize(args, gguf_path, s)
        cases.append({"text": s, "hf": hf, "llama_cpp": lc, "agree": hf == lc})
    out = {
        "gguf": str(gguf_path.relative_to(REPO)),
        "command": COMMAND,
        "versions": vers,
        "notes": ("hf = PreTrainedTokenizerFast from the model directory, add_special_tokens=False "
                  "(added special tokens such as <|turn> are still matched in the text); llama_cpp = "
                  "llama-tokenize -m GGUF --stdin --no-escape --ids --log-disable --no-bos "
                  "(parse_special on)."),
        "vocab_size": VOCAB,
        "special_ids": {s: i for i, s in enumerate(SPECIALS)},
        "cases": cases,
    }
    (GOLDEN / "gemma4_tiny_tokenizer.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", default="/work/dl/llama.cpp")
    ap.add_argument("--llama-cpp-py", default="/work/dl/llama_cpp_py")
    ap.add_argument("--keep", help="keep the HF model directories here")
    ap.add_argument("--only", choices=sorted(VARIANTS), action="append")
    ap.add_argument("--llamacpp-eval", nargs=2, metavar=("GGUF", "SEQS_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llamacpp_eval:
        llamacpp_eval_worker(*args.llamacpp_eval)
        return

    FIXTURES.mkdir(parents=True, exist_ok=True)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    vers = versions(args)
    tmp = Path(tempfile.mkdtemp(prefix="gemma4_tiny_"))
    work = Path(args.keep) if args.keep else tmp
    results = {}
    try:
        for name in args.only or list(VARIANTS):
            r = run_variant(args, name, work, vers)
            results[name] = r
            a = r["agreement"]
            print(f"{name}: {r['size']} bytes, top-1 {a['top1_agree']}/{a['positions']}, "
                  f"max|dlogit| {a['max_abs_logit_diff']:.3g} (rel {a['max_rel_logit_diff']:.3g}; "
                  f"{a['max_abs_logit_diff_hf_with_ggml_fp16_gelu']:.3g} with fp16 GELU in hf), "
                  f"min hf top-1 margin {a['hf_min_top1_margin']:.3g}, "
                  f"argmax==input {a['hf_argmax_equals_input_token']}, "
                  f"router gap {a.get('hf_min_router_topk_logit_gap')}", file=sys.stderr)
        if "e2b" in results:
            cases = tokenizer_check(args, results["e2b"]["model_dir"], FIXTURES / "gemma4_tiny_e2b.gguf", vers)
            n_ok = sum(c["agree"] for c in cases)
            print(f"tokenizer: {n_ok}/{len(cases)} strings agree", file=sys.stderr)
            for c in cases:
                if not c["agree"]:
                    print(f"  DISAGREE {c['text']!r}: hf {c['hf']} llama.cpp {c['llama_cpp']}", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
