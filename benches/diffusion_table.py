#!/usr/bin/env python3
"""The DiffusionGemma table of `h100.sh diffusion`: ms a denoising step of ours
(bench-diffusion, each step timed to its readback) and of llama.cpp's llama-diffusion-cli (the
median interval between its per-step progress lines, which it stamps as each step starts;
and, as a cross-check, the difference of whole runs at LONG and SHORT steps over LONG - SHORT,
the fastest of each run's repetitions), with in-step tok/s (canvas / step) and effective
tok/s for one block at a few step counts (canvas / (steps x step))."""
import json
import re
import sys
from pathlib import Path

# llama.cpp's log stamps (minutes.seconds.milliseconds.microseconds) on its progress lines.
STEP = re.compile(r"(\d+)\.(\d\d)\.(\d\d\d)\.(\d\d\d) I .diffusion step: (\d+)/(\d+)")


def step_intervals(path):
    """Seconds between consecutive steps' progress lines (the log keeps its carriage returns)."""
    text = path.read_text(newline="") if sys.version_info >= (3, 13) else open(path, newline="").read()
    stamps = [int(m[0]) * 60 + int(m[1]) + int(m[2]) / 1e3 + int(m[3]) / 1e6 for m in STEP.findall(text)]
    return [b - a for a, b in zip(stamps, stamps[1:])]


def main():
    d, long_, short = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ours = json.loads((d / f"ours-{long_}.json").read_text())
    ours_short = json.loads((d / f"ours-{short}.json").read_text())
    canvas = ours["canvas"]

    def best(n):
        times = [float(p.read_text().split()[-1]) for p in sorted(d.glob(f"llama-{n}-*.time"))]
        return min(times) if times else None

    t_long, t_short = best(long_), best(short)
    rows = [("wgemma", ours["step_ms"], f"median of {ours['steps']}-step blocks"),
            ("wgemma", ours_short["step_ms"], f"median of {ours_short['steps']}-step blocks")]
    intervals = sorted(i for p in sorted(d.glob(f"llama-{long_}-*.err")) for i in step_intervals(p))
    if intervals:
        step = intervals[len(intervals) // 2] * 1e3
        rows.append(("llama.cpp PR 24423", step, f"median of {len(intervals)} intervals between its step lines"))
    if t_long is not None and t_short is not None:
        step = (t_long - t_short) * 1e3 / (long_ - short)
        rows.append(("llama.cpp PR 24423", step, f"whole runs: ({t_long:.2f} s - {t_short:.2f} s) / {long_ - short}"))
    print(f"Canvas {canvas}, prompt {ours['prompt_tokens']} tokens; GPU: {ours['adapter']}; "
          f"our prompt read in {ours['encode_ms']:.1f} ms, our load {ours['load_s']:.1f} s.\n")
    print("| engine | ms a step | in-step tok/s | effective tok/s at 48 / 21 / 12 steps | how |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, ms, how in rows:
        eff = " / ".join(f"{canvas / (n * ms / 1e3):,.0f}" for n in (48, 21, 12))
        print(f"| {name} | {ms:.2f} | {canvas / (ms / 1e3):,.0f} | {eff} | {how} |")


if __name__ == "__main__":
    main()
