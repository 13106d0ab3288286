#!/usr/bin/env python3
"""Sums an ncu profile of one turn (`ncu --csv --page raw --metrics gpu__time_duration.sum,...`, e.g. of
bench/step_bench with STEP_PROFILE=1) by kernel: launches, us each (mean) and in all, in the order kernels first ran.
ncu runs every kernel on its own, so the times are a kernel's alone (no overlap with the launch before it).

usage: python3 bench/ncu_turn.py NCU.csv
"""
import csv
import io
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own notes and the program's output are not quoted
    rows = list(csv.reader(io.StringIO("".join(lines))))
    if len(rows) < 3:
        sys.exit(f"{sys.argv[1]}: no kernels")
    col = {k: i for i, k in enumerate(rows[0])}
    by = {}
    for r in rows[2:]:  # rows[1]: the units
        name = r[col["Kernel Name"]].split("(")[0][:64]
        by.setdefault(name, []).append(float(r[col["gpu__time_duration.sum"]].replace(",", "")) / 1e3)
    total = sum(sum(v) for v in by.values())
    print(f"{'kernel':64} {'n':>4} {'us each':>8} {'us':>8} {'share':>6}")
    for name, v in by.items():
        print(f"{name:64} {len(v):4d} {sum(v) / len(v):8.2f} {sum(v):8.1f} {sum(v) / total:6.1%}")
    print(f"{'all':64} {sum(len(v) for v in by.values()):4d} {'':8} {total:8.1f}")


if __name__ == "__main__":
    main()
