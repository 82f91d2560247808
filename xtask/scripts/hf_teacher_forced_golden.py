#!/usr/bin/env python3
"""Hugging Face transformers' f32 forward of the same GGUF, teacher-forced over the token
sequences of the llama.cpp golden: the argmax and top logit after every position.

transformers dequantizes the GGUF to f32 and runs exact f32 math, so it is the second,
independent truth (llama.cpp's CPU path quantizes activations to 8 bits).

    python3 -m pip install torch transformers accelerate gguf
    python3 xtask/scripts/hf_teacher_forced_golden.py MODEL_DIR MODEL.gguf \\
        crates/gemma4-text/tests/golden/llamacpp_gemma3_greedy.json \\
        > crates/gemma4-text/tests/golden/hf_gemma3_teacher_forced.json
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main(model_dir, gguf_file, llama_golden):
    golden = json.load(open(llama_golden))
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf_file, dtype=torch.float32)
    model.eval()
    cases = []
    for case in golden["cases"]:
        tokens = case["prompt_tokens"] + case["generated"]
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0]
        top, arg = logits.max(dim=-1)
        cases.append({"tokens": tokens,
                      "teacher_forced": [[int(a), float(t)] for a, t in zip(arg[:-1], top[:-1])]})
    return cases


if __name__ == "__main__":
    import transformers
    cases = main(*sys.argv[1:4])
    json.dump({"tool": f"transformers {transformers.__version__}, torch {torch.__version__}, float32",
               "cases": cases}, sys.stdout)
    print()
