#!/usr/bin/env python3
"""Charts bench/quant_bench.sh's results: decode tokens/s and prefill tokens/s per weight format.

usage: python3 bench/quant_chart.py OUT_DIR NAME      writes OUT_DIR/NAME.png (needs matplotlib: the GPU machine)

Left: decode tokens/s (log scale) for each dtype all resident, at --ring-gb 4 and at the minimum ring, over the
link alone and with the CPU share. llama.cpp's figures (the shared README's, same Llama-3-8B weights, measured on
the same machine on 2026-11-23, not rerun by this script) are drawn beside them for NAME 8b only: -ngl 0 against
the minimum ring, -ngl 8 (~4 GB) against --ring-gb 4, all layers against resident. Right: prefill tokens/s for
512-, 1024- and 2048-token prompts.
"""
import json
import os
import sys

DTYPES = ["f16", "q8", "q4"]
DECODE = [("resident", "all resident"), ("ring4_share", "ring 4 GB, CPU share"), ("ring4_link", "ring 4 GB, link"),
          ("min_share", "min ring, CPU share"), ("min_link", "min ring, link")]
LLAMA_CPP_8B = {  # tokens/s, ../shared/README.md (2026-11-23): F16, Q8_0, Q4_K_M
    "resident": {"f16": 140, "q8": 182, "q4": 192},
    "ring4_share": {"f16": 6.85, "q8": 10.84, "q4": 16.79},
    "min_share": {"f16": 5.08, "q8": 8.77, "q4": 13.26},
}


def load(d, name):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    d, name = sys.argv[1], sys.argv[2]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 1.3]})
    width = 0.8 / len(DTYPES)
    for i, dt in enumerate(DTYPES):
        xs, ys = [], []
        for k, (case, _) in enumerate(DECODE):
            r = load(d, f"{dt}_{case}.json")
            if r and r.get("decode_ms_per_token"):
                xs.append(k + (i - 1) * width)
                ys.append(1e3 / r["decode_ms_per_token"])
        if xs:
            bars = ax.bar(xs, ys, width, label=f"Djinn {dt}")
            for b, y in zip(bars, ys):
                ax.text(b.get_x() + b.get_width() / 2, y * 1.05, f"{y:.0f}" if y >= 10 else f"{y:.1f}",
                        ha="center", va="bottom", fontsize=7)
    if name.startswith("8b"):
        first = True
        for k, (case, _) in enumerate(DECODE):
            for i, dt in enumerate(DTYPES):
                v = LLAMA_CPP_8B.get(case, {}).get(dt)
                if v:
                    ax.plot([k + (i - 1) * width], [v], "k_", markersize=14, mew=2,
                            label="llama.cpp (F16 / Q8_0 / Q4_K_M; 2026-11-23)" if first else None)
                    first = False
    ax.set_yscale("log")
    ax.set_xticks(range(len(DECODE)))
    ax.set_xticklabels([label for _, label in DECODE], fontsize=8)
    ax.set_ylabel("decode tokens/s (log)")
    ax.set_title(f"{name}: decode")
    ax.legend(fontsize=7)

    for i, dt in enumerate(DTYPES):
        xs, ys = [], []
        for k, case in enumerate(["prefill", "prefill1k", "prefill2k"]):
            r = load(d, f"{dt}_{case}.json")
            if r and r.get("prefill_tok_s"):
                xs.append(k + (i - 1) * width)
                ys.append(r["prefill_tok_s"] / 1e3)
        if xs:
            bx.bar(xs, ys, width, label=dt)
    bx.set_xticks([0, 1, 2])
    bx.set_xticklabels(["512 tokens", "1024 tokens", "2048 tokens"], fontsize=8)
    bx.set_ylabel("prefill, thousand tokens/s")
    bx.set_title("prefill, all resident")
    bx.legend(fontsize=7)
    ceil = load(d, "ceilings.json") or {}
    fig.suptitle(f"H100, ceilings in the same run: D2D {ceil.get('hbm_d2d_gbs', 0):.0f} GB/s, pinned H2D "
                 f"{ceil.get('pcie_h2d_pinned_64mib_gbs', 0):.1f} GB/s", fontsize=9)
    fig.tight_layout()
    out = os.path.join(d, f"{name}.png")
    fig.savefig(out, dpi=110)
    print(f"quant_chart: wrote {out}")


if __name__ == "__main__":
    main()
