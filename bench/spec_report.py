#!/usr/bin/env python3
"""bench/spec_report.py: the report of bench/spec_bench.sh (markdown on stdout).

usage: python3 bench/spec_report.py OUT_DIR RING_GB [CASE]  (CASE: the title's words for the model and ring)

Reads OUT_DIR/link.json (ceilings), costs_share.json and costs_link.json (spec_bench: a verification pass of T rows,
a plain decode step, the draft's step), run_*.json (djinn --stats-json). The projection: a round drafts K tokens
(K draft steps: the catch-up on the last token, then K - 1) and verifies them in one pass of K + 1 rows; with each
drafted token accepted with probability a, independently, a pass gives (1 - a^(K+1)) / (1 - a) tokens.
"""
import glob
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def projection(c, a, k):
    per_pass = (1 - a ** (k + 1)) / (1 - a)
    ms = c["verify_ms"][k] + k * c["draft_step_ms"]  # verify_ms[k]: a pass of k + 1 rows
    return ms / per_pass, per_pass


def main():
    d, ring = sys.argv[1], float(sys.argv[2])
    case = sys.argv[3] if len(sys.argv) > 3 else f"Llama-3-8B shape (random weights), f16 target at the minimum ring ({ring} GB)"
    link = load(os.path.join(d, "link.json")) or {}
    h2d = link.get("pcie_h2d_pinned_64mib_gbs", 0)
    both = link.get("host_plus_h2d_gbs", 0)  # host memory read while H2D copies run, plus those copies
    print(f"# Speculative decoding, {case}, its q4 copy as the draft\n")
    print(f"{link.get('device', '?')}: pinned H2D {h2d:.2f} GB/s, D2H {link.get('pcie_d2h_pinned_64mib_gbs', 0):.2f} "
          f"GB/s" + (f", host memory read {link.get('host_read_gbs', 0):.1f} GB/s, host read + H2D together "
                     f"{both:.1f} GB/s" if both else "") + " (measured in this run)\n")

    runs = {}
    for p in glob.glob(os.path.join(d, "run_*.json")):
        runs[os.path.basename(p)[4:-5]] = load(p)
    print(f"## Measured: djinn -n {os.environ.get('N_NEW', '64')} greedy\n")
    print("| run | ms/token | tokens/s | x plain | tokens a pass | acceptance | draft ms a step | target ms a pass |"
          " streamed GB/token | link GB/s | weights GB/s a token (of the ceiling) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    order = ["plain"] + [f"k{k}" for k in (1, 2, 4, 8, 16)] + ["plain_link", "k4_link"]
    for name in order + sorted(set(runs) - set(order)):
        r = runs.get(name)
        if not r:
            continue
        base = runs.get("plain_link" if name.endswith("_link") else "plain")
        x = base["decode_ms_per_token"] / r["decode_ms_per_token"] if base and r["decode_ms_per_token"] else 0
        if "spec_passes" in r:
            steps = r["draft_s"] * 1e3 / r["draft_steps"] if r["draft_steps"] else 0
            sp = (f"{r['tokens_per_pass']:.2f} | {100 * r['acceptance']:.1f}% | {steps:.2f} | "
                  f"{r['target_s'] * 1e3 / max(r['spec_passes'], 1):.1f}")
        else:
            sp = "1 | - | - | -"
        # a plain run's streamed weights a token against their ceiling: the link's alone, or the host's and the
        # link's together with a CPU share
        gbs = (r.get("streamed_gb_per_token", 0) + r.get("cpu_gb_per_token", 0)) / r["decode_ms_per_token"] * 1e3
        ceil = both if r.get("cpu_share", 0) > 0 else h2d
        of = f"{gbs:.1f} ({gbs / ceil:.0%} of {'host read + H2D' if ceil == both else 'H2D'})" \
            if ceil and "spec_passes" not in r else "-"  # a drafted run's passes carry several tokens
        print(f"| {name} | {r['decode_ms_per_token']:.1f} | {r['decode_tok_s']:.2f} | {x:.2f} | {sp} | "
              f"{r.get('streamed_gb_per_token', 0):.2f} | {r.get('h2d_gb_s', 0):.1f} | {of} |")

    for tag, what in (("share", "CPU share automatic"), ("link", "CPU share off (the link alone)")):
        c = load(os.path.join(d, f"costs_{tag}.json"))
        if not c:
            continue
        v = c["verify_ms"]
        print(f"\n## Pass costs, {what} (spec_bench, median of {c['reps']})\n")
        print(f"Plain decode step {c['decode_step_ms']:.1f} ms; the draft's step {c['draft_step_ms']:.2f} ms.\n")
        print("| rows T | " + " | ".join(str(t + 1) for t in range(len(v))) + " |")
        print("|---|" + "---|" * len(v))
        print("| ms | " + " | ".join(f"{x:.1f}" for x in v) + " |")
        print("| x one row | " + " | ".join(f"{x / v[0]:.2f}" for x in v) + " |")
        print(f"\nProjected from these costs (ms/token; x: against the plain decode step of {c['decode_step_ms']:.1f} ms):\n")
        ks = [k for k in range(1, 17) if k < len(v)]
        print("| acceptance | " + " | ".join(f"K={k}" for k in ks) + " | best |")
        print("|---|" + "---|" * (len(ks) + 1))
        for a in (0.7, 0.8, 0.9):
            cells = [projection(c, a, k) for k in ks]
            best = min(range(len(ks)), key=lambda i: cells[i][0])
            print(f"| {int(a * 100)}% | " + " | ".join(f"{ms:.1f}" for ms, _ in cells) +
                  f" | K={ks[best]}: {cells[best][0]:.1f} ms/token, {cells[best][1]:.2f} tokens a pass, "
                  f"{c['decode_step_ms'] / cells[best][0]:.2f}x |")


if __name__ == "__main__":
    main()
