#!/usr/bin/env python3
"""The batched-decode table: `cargo xtask bench-batch --json` (ours-M.jsonl) next to
llama.cpp's `llama-batched-bench --output-format jsonl` (llama-M.jsonl / .err, whichever
stream its lines went to), per model and number of sequences.

Usage: batch_table.py DIR MODEL [MODEL ...]
"""
import json
import pathlib
import sys


def json_lines(*paths):
    for p in paths:
        if not p.exists():
            continue
        for line in p.read_text(errors="replace").splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    pass


def main():
    d = pathlib.Path(sys.argv[1])
    print("| model | sequences | decode tok/s, wgemma | llama.cpp | ratio | prefill tok/s, wgemma | llama.cpp |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in sys.argv[2:]:
        ours = {r["sequences"]: r for r in json_lines(d / f"ours-{m}.jsonl")}
        llama = {r["pl"]: r for r in json_lines(d / f"llama-{m}.jsonl", d / f"llama-{m}.err") if "pl" in r}
        for n in sorted(set(ours) | set(llama)):
            o, l = ours.get(n, {}), llama.get(n, {})
            od, ld = o.get("decode_tok_s"), l.get("speed_tg")
            ratio = f"{od / ld:.2f}x" if od and ld else "-"
            fmt = lambda v: f"{v:,.0f}" if v else "-"
            print(f"| {m} | {n} | {fmt(od)} | {fmt(ld)} | {ratio} | {fmt(o.get('prefill_tok_s'))} | {fmt(l.get('speed_pp'))} |")


if __name__ == "__main__":
    main()
