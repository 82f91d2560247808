"""The `profile` of a `cargo xtask dawn-bench --profile` JSON line as a table.

    python3 benches/dawn_profile.py FILE

prints, per profiled step (prefill, decode), its kernels by GPU time: dispatches, time per
dispatch, total.
"""
import json
import sys


def main():
    with open(sys.argv[1]) as f:
        line = f.read().strip().splitlines()[-1]
    out = json.loads(line)
    steps = out.get("profile")
    if not steps:
        print("no profile (the adapter has no timestamp queries)")
        return
    for step in steps:
        print(f"{step['what']} ({step['tokens']} tokens): {step['totalUs']:.0f} us of kernels")
        for k in sorted(step["kernels"], key=lambda k: -k["us"]):
            n = k["dispatches"]
            print(f"  {k['name']:18} {n:5} x {k['us'] / n:9.1f} us = {k['us']:10.1f} us")
    rest = {k: v for k, v in out.items() if k != "profile"}
    print(json.dumps(rest))


main()
