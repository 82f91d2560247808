"""The table of benches/pairs.sh: per model, the medians of each side's runs and the median
(and range) of the pairwise prefill change. Usage: pairs.py DIR MODEL..."""
import json
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.loads(f.read().strip().splitlines()[-1])


def main():
    out, models = sys.argv[1], sys.argv[2:]
    print("| model | prefill tok/s, ours / base | decode tok/s, ours / base "
          "| pairwise prefill change, median (range) | prefill CPU ms, ours / base | pairs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for m in models:
        pairs = []
        i = 1
        while os.path.exists(os.path.join(out, f"{i}-ours-{m}.json")):
            pairs.append((load(os.path.join(out, f"{i}-ours-{m}.json")),
                          load(os.path.join(out, f"{i}-base-{m}.json"))))
            i += 1
        if not pairs:
            continue
        med = lambda side, key: statistics.median(p[side][key] for p in pairs)
        change = [100 * (o["prefill_tok_s"] / b["prefill_tok_s"] - 1) for o, b in pairs]
        print(f"| {m} | {med(0, 'prefill_tok_s'):,.0f} / {med(1, 'prefill_tok_s'):,.0f} "
              f"| {med(0, 'decode_tok_s'):,.1f} / {med(1, 'decode_tok_s'):,.1f} "
              f"| {statistics.median(change):+.1f}% ({min(change):+.1f}% .. {max(change):+.1f}%) "
              f"| {med(0, 'prefill_cpu_ms'):.2f} / {med(1, 'prefill_cpu_ms'):.2f} | {len(pairs)} |")


if __name__ == "__main__":
    main()
