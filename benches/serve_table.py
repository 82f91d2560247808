#!/usr/bin/env python3
"""The HTTP serving table: `cargo xtask bench-serve --json` against our server (ours.jsonl)
and against llama-server (llama.jsonl), per number of concurrent streams.

Usage: serve_table.py DIR
"""
import json
import pathlib
import sys


def rows(path):
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[r["concurrency"]] = r
    return out


def main():
    d = pathlib.Path(sys.argv[1])
    ours, llama = rows(d / "ours.jsonl"), rows(d / "llama.jsonl")
    print("| streams | decode tok/s (streams summed), wgemma | llama-server | ratio "
          "| tok/s over the round, wgemma | llama-server "
          "| TTFT p50 / p95 ms, wgemma | llama-server |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    fmt = lambda v: f"{v:,.0f}" if v else "-"
    for n in sorted(set(ours) | set(llama)):
        o, l = ours.get(n, {}), llama.get(n, {})
        od, ld = o.get("stream_tok_s_sum"), l.get("stream_tok_s_sum")
        ratio = f"{od / ld:.2f}x" if od and ld else "-"
        ttft = lambda r: f"{r['ttft_p50_ms']:,.0f} / {r['ttft_p95_ms']:,.0f}" if r else "-"
        print(f"| {n} | {fmt(od)} | {fmt(ld)} | {ratio} | {fmt(o.get('throughput_tok_s'))} "
              f"| {fmt(l.get('throughput_tok_s'))} | {ttft(o)} | {ttft(l)} |")


main()
