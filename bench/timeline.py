#!/usr/bin/env python3
"""Draws one decode step of a `djinn --trace` file and prints every step's figures.

usage: python3 bench/timeline.py TRACE.json [OUT.png] [--step K] [--ceilings CEILINGS.json] [--title TEXT]

The picture (OUT.png; needs matplotlib), x in ms from the step's start, one lane each:
  copy stream     each streamed unit's H2D copy, labelled with its unit (L0.., head); the copies of the step after
                  it that ran inside it are drawn lighter
  compute stream  each unit's work, labelled; before it the stream's wait for its copy (red); inside it each split
                  matmul: the GPU's rows (dark), then the stream idle until the CPU's rows are placed (hatched)
  CPU share       the host waiting for a split's x (grey), then the CPU's rows on every core (green)
K defaults to the second step (the first when there is one). The figures, every step: its ms, the compute stream's
wait for copies and for the CPU's rows, the copy stream's busy fraction and GB/s, the CPU share's busy fraction,
and the streamed weights' GB/s; with CEILINGS (bench/ceilings.cu's JSON, LINK_ONLY=1 is enough) as fractions of
pinned H2D (the copies; the weights without a CPU share) and of host read + H2D together (the weights with one).
"""
import argparse
import json
import sys


def unit_name(u, nl):
    return "head" if u == nl else f"L{u}"


def figures(tr, ceil):
    """One line a step."""
    h2d, both = ceil.get("pcie_h2d_pinned_64mib_gbs"), ceil.get("host_plus_h2d_gbs")
    lines = []
    for s in tr["steps"]:
        cpu = s["cpu_bytes"] > 0
        of_w = both if cpu else h2d
        lines.append(
            f"step {s['step']}: {s['ms']:.1f} ms; the compute stream waited {s['wait_ms']:.1f} ms for copies and "
            f"{s['gpu_waits_cpu_ms']:.1f} ms for the CPU's rows; copy stream busy {s['copy_busy']:.0%} at "
            f"{s['copy_gb_s']:.1f} GB/s" + (f" ({s['copy_gb_s'] / h2d:.0%} of pinned H2D)" if h2d else "") +
            f"; CPU share busy {s['cpu_busy']:.0%}, waited {s['cpu_wait_ms']:.1f} ms for x; weights "
            f"{(s['copy_bytes'] + s['cpu_bytes']) / 1e9:.2f} GB at {s['weights_gb_s']:.1f} GB/s" +
            (f" ({s['weights_gb_s'] / of_w:.0%} of {'host read + H2D' if cpu else 'pinned H2D'})" if of_w else ""))
    return lines


def draw(tr, k, out, title):
    try:
        import matplotlib
    except ImportError:
        sys.exit("timeline: matplotlib is missing: no picture (the figures above are complete)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    nl = tr["n_layers"]
    step = next(s for s in tr["steps"] if s["step"] == k)
    x0, x1 = step["t0"], step["t1"]
    mine = [iv for iv in tr["intervals"] if iv["step"] == k]
    ahead = [iv for iv in tr["intervals"] if iv["lane"] == "copy" and iv["step"] == k + 1 and iv["t0"] < x1]
    lo = min([x0] + [iv["t0"] for iv in mine if iv["lane"] == "copy"]) - x0
    span = x1 - x0 - lo
    fig, ax = plt.subplots(figsize=(18, 4.6))
    Y = {"copy": 2, "compute": 1, "cpu": 0}
    H = 0.62

    def bar(lane, a, b, color, h=H, dy=0.0, **kw):
        ax.broken_barh([(a - x0, max(b - a, 1e-4))], (Y[lane] - h / 2 + dy, h), facecolors=color, **kw)

    def label(lane, a, b, text, dy=0.0):
        if (b - a) > 0.012 * span:
            ax.text((a + b) / 2 - x0, Y[lane] + dy, text, ha="center", va="center", fontsize=6, clip_on=True)

    for i, iv in enumerate(sorted((iv for iv in mine if iv["kind"] == "copy"), key=lambda v: v["t0"])):
        bar("copy", iv["t0"], iv["t1"], "#2a6f97" if i % 2 else "#468faf", edgecolor="white", linewidth=0.3)
        label("copy", iv["t0"], iv["t1"], unit_name(iv["unit"], nl))
    for iv in ahead:
        bar("copy", iv["t0"], iv["t1"], "#a9d6e5", edgecolor="white", linewidth=0.3)
        label("copy", iv["t0"], min(iv["t1"], x1), unit_name(iv["unit"], nl))
    units = sorted((iv for iv in mine if iv["kind"] == "unit"), key=lambda v: v["t0"])
    for i, iv in enumerate(units):
        bar("compute", iv["t0"], iv["t1"], "#f4a261" if i % 2 else "#e9c46a", edgecolor="white", linewidth=0.3)
        label("compute", iv["t0"], iv["t1"], unit_name(iv["unit"], nl), dy=H / 2 + 0.08)
    for iv in mine:
        if iv["kind"] == "wait":
            bar("compute", iv["t0"], iv["t1"], "#d62828")
        elif iv["kind"] == "split":
            bar("compute", iv["t0"], iv["mid"], "#6c584c", h=H * 0.5)
            bar("compute", iv["mid"], iv["t1"], "white", h=H * 0.5, hatch="////", edgecolor="#6c584c", linewidth=0.3)
        elif iv["kind"] == "wait_x":
            bar("cpu", iv["t0"], iv["t1"], "#adb5bd")
        elif iv["kind"] == "rows":
            bar("cpu", iv["t0"], iv["t1"], "#2d6a4f")
    for x in (0, x1 - x0):
        ax.axvline(x, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks([Y["cpu"], Y["compute"], Y["copy"]])
    ax.set_yticklabels(["CPU share (host)", "compute stream", "copy stream"])
    ax.set_ylim(-0.6, 2.75)
    ax.set_xlim(lo - 0.01 * span, x1 - x0 + 0.01 * span)
    ax.set_xlabel(f"ms from the start of decode step {k} (dashed: its start and end)")
    ax.legend(handles=[Patch(facecolor="#468faf", label="H2D copy of a unit (this step's)"),
                       Patch(facecolor="#a9d6e5", label="the next step's copies"),
                       Patch(facecolor="#e9c46a", label="a unit's work on the GPU"),
                       Patch(facecolor="#d62828", label="compute waits for a copy"),
                       Patch(facecolor="#6c584c", label="split matmul: the GPU's rows"),
                       Patch(facecolor="white", hatch="////", edgecolor="#6c584c", label="split: waiting for the CPU's rows"),
                       Patch(facecolor="#adb5bd", label="host waits for x"),
                       Patch(facecolor="#2d6a4f", label="CPU computes its rows")],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize=7, frameon=False)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=150)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("out", nargs="?")
    p.add_argument("--step", type=int)
    p.add_argument("--ceilings")
    p.add_argument("--title")
    a = p.parse_args()
    try:
        with open(a.trace) as f:
            tr = json.load(f)
        ceil = {}
        if a.ceilings:
            with open(a.ceilings) as f:
                ceil = json.load(f)
    except (OSError, ValueError) as ex:
        sys.exit(f"timeline: {ex}")
    if tr.get("format") != "djinn-trace":
        sys.exit(f"timeline: {a.trace} is not a djinn --trace file")
    if not tr["steps"]:
        sys.exit(f"timeline: {a.trace} holds no decode step (the run ended first)")
    streamed = tr["resident"].count(0)
    head = (f"{tr['device']}: {tr['dtype']}, {tr['n_layers']} layers + head, {streamed} units streamed, CPU share "
            f"{tr['cpu_share']:.2f} at set-up; {tr['bytes_per_token'] / 1e9:.2f} GB a token over PCIe, "
            f"{tr['cpu_bytes_per_token'] / 1e9:.2f} GB read by the CPU")
    print(head)
    lines = figures(tr, ceil)
    for line in lines:
        print(line)
    if a.out:
        k = a.step or (2 if len(tr["steps"]) > 1 else 1)
        if not any(s["step"] == k for s in tr["steps"]):
            sys.exit(f"timeline: no step {k} in {a.trace} (steps 1..{len(tr['steps'])})")
        draw(tr, k, a.out, (a.title + "\n" if a.title else "") + head + "\n" + lines[k - 1])
        print(f"wrote {a.out} (step {k})")


if __name__ == "__main__":
    main()
