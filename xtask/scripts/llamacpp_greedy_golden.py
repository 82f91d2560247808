#!/usr/bin/env python3
"""llama.cpp's own greedy continuations of a set of prompts, with its logits.

For each prompt: llama.cpp's tokens (BOS added, special-token text parsed), the 32 tokens it
generates greedily, and after every position the argmax and the largest logit of its
teacher-forced logits. The Rust test `gemma3_270m_agrees_with_llama_cpp` feeds prompt +
continuation to our GPU forward and compares the argmax at every position.

llama.cpp is the one vendored in the llama-cpp-python 0.3.36 sdist, built with cmake (see
../shared/ENVIRONMENT.md); its Python bindings (the sdist's llama_cpp/ package) load that build:

    LLAMA_CPP_LIB_PATH=LLAMA_BUILD/bin PYTHONPATH=SDIST_DIR python3 \\
        xtask/scripts/llamacpp_greedy_golden.py MODEL.gguf > crates/gemma4-text/tests/golden/llamacpp_gemma3_greedy.json
"""
import json
import sys

import numpy as np
import llama_cpp

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "The three primary colors are",
    "<start_of_turn>user\nWhat is the boiling point of water?<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nWrite a haiku about autumn.<end_of_turn>\n<start_of_turn>model\n",
    "Die Hauptstadt von Deutschland ist",
    "1, 2, 3, 4, 5,",
    "The quick brown fox",
    "<start_of_turn>user\nTranslate 'good morning' to Spanish.<end_of_turn>\n<start_of_turn>model\n",
    "In mathematics, a prime number is",
    "日本の首都は",
]
N_PREDICT = 32


def main(model_path):
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=512, n_threads=2, logits_all=True,
                          verbose=False, seed=0)
    cases = []
    for prompt in PROMPTS:
        llm.reset()
        tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        llm.eval(tokens)
        generated = []
        for _ in range(N_PREDICT):
            logits = np.array(llm.scores[llm.n_tokens - 1])
            tok = int(logits.argmax())
            generated.append(tok)
            if tok in (1, 106):
                break
            llm.eval([tok])
        all_tokens = tokens + generated
        positions = []
        for i in range(len(all_tokens) - 1):
            logits = np.array(llm.scores[i])
            positions.append([int(logits.argmax()), float(logits.max())])
        cases.append({"prompt": prompt, "prompt_tokens": tokens, "generated": generated,
                      "teacher_forced": positions})
        print(f"{prompt!r}: {llm.detokenize(generated).decode(errors='replace')!r}", file=sys.stderr)
    return cases


if __name__ == "__main__":
    json.dump({"tool": "llama.cpp from llama-cpp-python 0.3.36 (CPU, 2 threads), greedy",
               "model_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
               "n_predict": N_PREDICT, "cases": main(sys.argv[1])}, sys.stdout)
    print()
