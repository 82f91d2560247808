#!/usr/bin/env python3
"""One markdown table from benches/h100.sh's results: our `bench-e2e --json` (e2e-M.json)
next to llama.cpp's `llama-bench -o json` (llama-bench-M.json) for each model M.

    python3 benches/table.py OUT_DIR MODEL...
"""
import json
import os
import sys


def ours(out, m):
    path = os.path.join(out, f"e2e-{m}.json")
    try:
        with open(path) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def llama(out, m):
    """{(kind, flash attention on): tok/s}, kind "pp" or "tg"."""
    path = os.path.join(out, f"llama-bench-{m}.json")
    try:
        with open(path) as f:
            runs = json.load(f)
    except (OSError, ValueError):
        return {}
    got = {}
    for r in runs:
        kind = "pp" if r.get("n_gen", 0) == 0 else "tg"
        # Older llama-bench writes a bool, newer an int (-1 auto, 0 off, 1 on).
        fa = r.get("flash_attn")
        # The median, as bench-e2e reports: llama-bench's first repetition of a prompt runs
        # cold (E2B pp512: 9,300 tok/s, then 13,721 and 14,764), which drags its mean down.
        samples = sorted(r.get("samples_ts") or [r["avg_ts"]])
        n = len(samples)
        median = (samples[(n - 1) // 2] + samples[n // 2]) / 2
        got[(kind, fa is True or fa == 1)] = (median, r.get("n_prompt") or r.get("n_gen"))
    return got


def both(ll, kind):
    off, on = ll.get((kind, False)), ll.get((kind, True))
    if not off and not on:
        return "-"
    fmt = lambda v: f"{v[0]:,.0f}" if v else "-"
    tokens = (off or on)[1]
    return f"{fmt(off)} / {fmt(on)} ({kind}{tokens})"


def ratio(a, ll, kind):
    best = max((v[0] for (k, _), v in ll.items() if k == kind), default=None)
    return f"{a / best:.2f}x" if best else "-"


def main():
    out, models = sys.argv[1], sys.argv[2:]
    print("| model | wgemma prefill tok/s | llama.cpp pp (fa off / on) | wgemma decode tok/s "
          "| llama.cpp tg (fa off / on) | decode vs best llama.cpp | time to first token "
          "| GPU memory | decode vs bytes floor |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in models:
        o, ll = ours(out, m), llama(out, m)
        if o is None:
            print(f"| {m} | (no run) | {both(ll, 'pp')} | | {both(ll, 'tg')} | | | | |")
            continue
        print(
            f"| {m} ({o['prompt_tokens']} + {o['decode_tokens']} tokens) "
            f"| {o['prefill_tok_s']:,.0f} | {both(ll, 'pp')} "
            f"| {o['decode_tok_s']:,.1f} | {both(ll, 'tg')} | {ratio(o['decode_tok_s'], ll, 'tg')} "
            f"| {o['ttft_ms']:.1f} ms | {o['gpu_memory_bytes'] / 2**20:,.0f} MiB "
            f"| {100 * o['floor_fraction']:.1f}% |"
        )
    adapter = next((o["adapter"] for o in map(lambda m: ours(out, m), models) if o), "?")
    print(f"\nwgemma on {adapter}; llama.cpp: llama-bench (CUDA) on the same GGUF files. "
          "Medians of the repetitions on both sides.")


if __name__ == "__main__":
    main()
