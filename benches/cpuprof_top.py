"""Where a thread's CPU time went, from Node's `--cpu-prof` output (`cargo xtask dawn-bench
--cpu-prof DIR`).

    python3 benches/cpuprof_top.py DIR [N]

For each `.cpuprofile` in DIR holding at least a tenth of a second of samples, prints the N
functions (default 25) with the most self time: wasm functions by name, the JavaScript glue
of wasm-bindgen, Dawn's native bindings, and Node's "(program)" / "(idle)" / "(garbage
collector)".
"""
import collections
import json
import pathlib
import sys


def summarize(path, top):
    prof = json.loads(path.read_text())
    nodes = {n["id"]: n for n in prof["nodes"]}
    self_us = collections.Counter()
    for node_id, dt in zip(prof["samples"], prof["timeDeltas"]):
        frame = nodes[node_id]["callFrame"]
        name = frame["functionName"] or "(anonymous)"
        where = frame["url"].rsplit("/", 1)[-1] or frame.get("codeType", "")
        self_us[f"{name}  [{where}]"] += dt
    total = sum(self_us.values())
    if total < 100_000:
        return
    busy = total - self_us.get("(idle)  []", 0)
    print(f"\n{path.name}: {total / 1e3:.0f} ms sampled, {busy / 1e3:.0f} ms not idle")
    for name, us in self_us.most_common(top):
        print(f"  {us / 1e3:9.1f} ms {100 * us / total:5.1f}%  {name}")


def main():
    folder = pathlib.Path(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    for path in sorted(folder.glob("*.cpuprofile")):
        summarize(path, top)


main()
