#!/usr/bin/env python3
"""llama.cpp's token ids for sets of strings, as goldens for `crates/gemma4-text/tests/`.

`gemma3`: the real Gemma 3 vocabulary (SentencePiece path). `gemma4-synth`: a small synthetic
Gemma 4 vocabulary (`tokenizer.ggml.model = "gemma4"`, BPE path), written to a temporary GGUF
with gguf-py; the golden stores the vocabulary itself, so the Rust test rebuilds it without
the file.

Each string is fed to `llama-tokenize` on stdin with escape processing off, so the ids belong
to exactly the bytes stored in the golden (`-p` would turn a literal backslash-n into a
newline). Strings are recorded with llama-tokenize's defaults (BOS added when the vocab asks
for it, special-token text parsed) and some also with `--no-bos` and/or `--no-parse-special`.

    python3 xtask/scripts/tokenizer_golden.py gemma3 LLAMA_BUILD/bin/llama-tokenize MODEL.gguf \\
        > crates/gemma4-text/tests/golden/tokenizer_gemma3.json
    PYTHONPATH=LLAMA_CPP/gguf-py python3 xtask/scripts/tokenizer_golden.py gemma4-synth \\
        LLAMA_BUILD/bin/llama-tokenize > crates/gemma4-text/tests/golden/tokenizer_gemma4_synth.json
"""
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile

# (text, extra variants): a variant is (add_special, parse_special); (True, True) is always run.
BOTH = [(False, True), (True, False), (False, False)]
NO_BOS = [(False, True)]
NO_PARSE = [(True, False)]

CASES = [
    # English, punctuation, numbers, URLs
    ("Hello world", NO_BOS),
    ("The quick brown fox jumps over the lazy dog.", []),
    ("Why is the sky blue? Rayleigh scattering, mostly!", []),
    ("It's a dog's life; isn't it? They're here, we've gone.", []),
    ("1234567890 3.14159 -42 1e-9 0x1F 1,000,000", []),
    ("https://example.com/path?q=tokenizer&lang=en#section-2", []),
    ("user@example.org, +1 (555) 123-4567", []),
    # European languages
    ("Größe, Straße, Übermäßig, Äpfel und Öl.", []),
    ("Donaudampfschifffahrtsgesellschaftskapitänskajüte", []),
    ("Ça va? Où est la bibliothèque? L'été dernier, à Noël.", []),
    ("Zażółć gęślą jaźń. Pchnąć w tę łódź jeża lub ośm skrzyń fig.", []),
    ("Съешь же ещё этих мягких французских булок, да выпей чаю.", []),
    ("Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", []),
    # Right-to-left, Indic, CJK, Thai
    ("مرحبا بالعالم! كيف حالك اليوم؟", []),
    ("שלום עולם, מה שלומך?", []),
    ("नमस्ते दुनिया, आप कैसे हैं?", []),
    ("你好，世界！今天天气很好。", []),
    ("日本語のテキスト、ひらがなとカタカナと漢字。", []),
    ("안녕하세요, 세계! 반갑습니다.", []),
    ("สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรค", []),
    ("𠀀𠀁𠀂 rare CJK extension B", []),
    ("ꙮ ᚠᚢᚦ 𝄞 ∑∫√∞ ≠ ≤", []),
    ("e\u0301 a\u0308 combining marks", []),
    # Emoji
    ("Hello 👋 world 🌍", []),
    ("👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs", []),
    ("🇩🇪🇫🇷🇯🇵🇺🇸", []),
    ("😀😃😄😁😆😅🤣😂🙂🙃", []),
    # Code
    ("fn main() {\n    let x: Vec<u32> = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n", []),
    ("def f(n):\n\tif n < 2:\n\t\treturn n\n\treturn f(n - 1) + f(n - 2)\n", []),
    ("class A:\n    def __init__(self):\n        self.x = {'a': [1, 2]}  # comment\n", []),
    ("#include <stdio.h>\nint main(void) { return 0; }", []),
    # Whitespace runs
    (" ", NO_BOS),
    ("a b", []),
    ("a  b", NO_PARSE),
    ("a   b", []),
    ("a" + " " * 5 + "b", []),
    ("a" + " " * 8 + "b", []),
    ("a" + " " * 16 + "b", []),
    ("a" + " " * 31 + "b", NO_PARSE),
    ("a" + " " * 32 + "b", []),
    ("a" + " " * 33 + "b", []),
    ("a" + " " * 40 + "b", BOTH),
    (" " * 40, []),
    ("  leading and trailing  ", []),
    (" leading single", []),
    ("trailing single ", []),
    ("\n", NO_BOS),
    ("\n\n", []),
    ("line1\nline2\n\n\nline3\n", NO_PARSE),
    ("\n" * 40, []),
    ("windows\r\nline\r\n\r\nend\r", []),
    ("mixed \t tabs\t\t\tand  spaces \n \n", BOTH),
    ("\t" * 35, []),
    # Special-token text
    ("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", BOTH),
    ("<bos>", BOTH),
    ("<bos>Hello", BOTH),
    ("<eos><pad><unk><mask>", BOTH),
    ("<unused12>", BOTH),
    ("text<unused0>more<unused6241>", NO_PARSE),
    ("<start_of_image><end_of_image>[multimodal]", BOTH),
    ("<s>strike</s> and <b>bold</b>", BOTH),
    ("<div class=\"x\"><p>Hi</p><br></div>", NO_PARSE),
    ("<table><tr><td>1</td></tr></table>", []),
    ("<start_of_turn<end_of_turn>>", BOTH),
    ("<0x41><0x0A><0xZZ>", BOTH),
    ("<|turn>user\n<turn|>", []),
    # Odd bytes and long words
    ("", NO_BOS),
    ("\x00\x01\x02\x7f", []),
    ("\ufffd\ufeff\u200b\u2028", []),
    ("a" * 300, []),
    ("Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism", []),
    ("supercalifragilisticexpialidocious" * 4, []),
    ("▁already▁escaped ▁", []),
    ("<unused99999> <start_of_turn> model", NO_PARSE),
    ("  \n  \n\t \n", []),
    # A mixed document: prose, lists, code, several scripts, one chat turn.
    ("# Notes\n\nThe *tokenizer* splits text into pieces.  Two spaces, then:\n\n"
     "1. Größe — 大小 — размер\n2. `let x = 5;`\n\n```python\nfor i in range(3):\n"
     "    print(i)  # 0 1 2\n```\n\n<start_of_turn>user\nThanks! 🙏<end_of_turn>\n", BOTH),
]


def tokenize(exe, model, text, add_special, parse_special):
    args = [exe, "-m", model, "--stdin", "--no-escape", "--ids", "--log-disable"]
    if not add_special:
        args.append("--no-bos")
    if not parse_special:
        args.append("--no-parse-special")
    out = subprocess.run(args, input=text.encode("utf-8"), capture_output=True, check=True)
    line = out.stdout.decode().strip().splitlines()[-1]
    return json.loads(line)


def header(exe, model):
    version = subprocess.run([exe, "--version"], capture_output=True, text=True)
    with open(model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return {
        "command": "llama-tokenize -m MODEL --stdin --no-escape --ids --log-disable"
                   " [--no-bos] [--no-parse-special] < TEXT",
        "llama_cpp_version": (version.stdout + version.stderr).strip(),
        "model": os.path.basename(model),
        "model_sha256": sha,
    }


def write(head, cases, vocab=None):
    # One case per line keeps the golden readable and its diffs small.
    out = json.dumps(head, ensure_ascii=False, indent=1)[:-2]
    if vocab is not None:
        out += ',\n "vocab": {\n'
        out += ",\n".join("  %s: %s" % (json.dumps(k), json.dumps(v, ensure_ascii=False))
                           for k, v in vocab.items())
        out += "\n }"
    out += ',\n "cases": [\n'
    out += ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases)
    out += "\n ]\n}\n"
    sys.stdout.write(out)


def run_cases(exe, model, strings):
    cases = []
    for text, variants in strings:
        for add_special, parse_special in [(True, True)] + variants:
            ids = tokenize(exe, model, text, add_special, parse_special)
            cases.append({"text": text, "add_special": add_special,
                          "parse_special": parse_special, "ids": ids})
    return cases


def gemma3(exe, model):
    write(header(exe, model), run_cases(exe, model, CASES))


def synth_vocab(rng):
    """Gemma 4-like: specials typed as llama.cpp's converter types them, single characters,
    tokens made by random merges (some rules make no token, one is repeated, one has no
    space), and byte tokens with one missing."""
    tokens, types = [], []
    for t, ty in [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 3), ("<mask>", 3),
                  ("<|turn>", 3), ("<turn|>", 3), ("<|tool_response>", 4), ("<|\"|>", 4),
                  ("</s>", 1), ("  ", 4)]:
        tokens.append(t)
        types.append(ty)
    chars = list("abcdeo1.,!?\u2581") + ["\n", "é", "日", "本", "👋"]
    tokens += chars + ["\n\n", "\n\n\n"]
    types += [1] * (len(chars) + 2)
    pool = [c for c in chars if c != "\n"]
    merges = []
    while len(merges) < 400:
        a, b = rng.choice(pool), rng.choice(pool)
        rule = a + " " + b
        if len(a + b) > 10 or rule in merges:
            continue
        merges.append(rule)
        if a + b not in tokens and rng.random() < 0.9:
            tokens.append(a + b)
            types.append(1)
            pool.append(a + b)
    merges += ["\n \n", "a zz", merges[0], "nospace"]
    for b in range(256):
        if b != 0xA9:
            tokens.append("<0x%02X>" % b)
            types.append(6)
    return tokens, types, merges


def gemma4_synth(exe):
    import gguf

    rng = random.Random(4)
    tokens, types, merges = synth_vocab(rng)
    vocab = {"tokens": tokens, "token_type": types, "merges": merges, "bos_token_id": 2,
             "eos_token_id": 1, "add_bos_token": False}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "gemma4-synth.gguf")
        # vocab_only loading still reads the architecture's hyperparameters.
        w = gguf.GGUFWriter(path, "llama")
        w.add_context_length(128)
        w.add_embedding_length(8)
        w.add_block_count(1)
        w.add_feed_forward_length(8)
        w.add_head_count(1)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_tokenizer_model("gemma4")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_scores([-1000.0] * len(tokens))
        w.add_token_merges(merges)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_add_bos_token(False)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        parts = list("abcde o1.,!? ") + ["\n", "\n\n", "\n\n\n\n", "  ", "   ", "é", "日本", "👋",
                                      "x", "ü", "\t", "\u2581", "<|turn>", "<turn|>", "<|turn",
                                      "<|tool_response>", "<|\"|>", "</s>", "<mask>", "<bos>"]
        strings = [("", BOTH)]
        for _ in range(150):
            text = "".join(rng.choice(parts) for _ in range(rng.randint(1, 30)))
            strings.append((text, BOTH))
        head = header(exe, path)
        head["model"] = "synthetic Gemma 4 vocabulary (see \"vocab\")"
        write(head, run_cases(exe, path, strings), vocab)


if __name__ == "__main__":
    if sys.argv[1] == "gemma3":
        gemma3(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "gemma4-synth":
        gemma4_synth(sys.argv[2])
    else:
        sys.exit("usage: tokenizer_golden.py gemma3 LLAMA_TOKENIZE MODEL | gemma4-synth LLAMA_TOKENIZE")
