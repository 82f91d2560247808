"""The table of `h100.sh dawn`: native bench-e2e and wasm + Dawn (dawn-bench) side by side.

    python3 benches/dawn_table.py DIR MODEL...

reads DIR/native-MODEL.json and DIR/dawn-MODEL.json (one JSON object each) and prints a
Markdown table: decode and prefill tok/s of both and the browser's share of native, and time
to first token.
"""
import json
import sys


def read(path):
    try:
        with open(path) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def main():
    out, models = sys.argv[1], sys.argv[2:]
    print("| model | decode tok/s wasm+Dawn / native | prefill tok/s wasm+Dawn / native | TTFT ms wasm+Dawn / native |")
    print("| --- | ---: | ---: | ---: |")
    rows = [(m, m, m) for m in models]
    # Gemma 4 with the per-layer table fetched a row per token in the browser, where that
    # run exists (the default uploads it whole).
    rows += [(f"{m}, table rows fetched", m, f"fetch-{m}") for m in models if read(f"{out}/dawn-fetch-{m}.json")]
    for label, m, dawn in rows:
        n, d = read(f"{out}/native-{m}.json"), read(f"{out}/dawn-{dawn}.json")
        if not n or not d:
            print(f"| {label} | missing: native {n is not None}, dawn {d is not None} | | |")
            continue
        share = lambda key: f"{d[key]:,.0f} / {n[key]:,.0f} ({100 * d[key] / n[key]:.0f}%)"
        print(f"| {label} | {share('decode_tok_s')} | {share('prefill_tok_s')} | {d['ttft_ms']:.1f} / {n['ttft_ms']:.1f} |")
    adapter = next((read(f"{out}/dawn-{m}.json") for m in models if read(f"{out}/dawn-{m}.json")), None)
    if adapter:
        print(f"\nDawn adapter: {adapter.get('adapter')} ({adapter.get('backend')}), "
              f"shader-f16 {adapter.get('shaderF16')}, subgroups {adapter.get('subgroups')}")


main()
