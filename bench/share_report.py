#!/usr/bin/env python3
"""bench/share_report.py: the table of bench/share_bench.sh, from its sweeps (bench/share_sweep.c's JSON, one record a
case: {"label": "<dtype>_<ring>", "result": {...}}) and the ceilings of the same call (bench/ceilings.cu, LINK_ONLY=1).

usage: share_report.py NAME SWEEPS.jsonl CEILINGS.json [NAME SWEEPS CEILINGS ...]

Per case (T = 1, a decode step): the link alone (share 0), the best fixed share, the automatic one and their ratio;
the weights a pass streams, and the rate of both sides together against the combined ceiling (host memory read beside
pinned H2D copies, plus those copies) and, where the ceilings have it, against the dtype's own: the CPU share's q4 or
f16 matvec beside the copies, plus those copies (its AVX-512 or prefetching loads read faster than the plain
reader). The bytes streamed are the link-only pass's time at the call's pinned H2D rate
(marked *: on this H200 machine the link alone ran at 0.99-1.0 of it, bench/results/link_8b 0.98), unless the sweep
record names them (ring plans print them: djinn's 'GB per token over PCIe').
"""
import json
import sys


def records(path):
    txt, dec, i, out = open(path).read(), json.JSONDecoder(), 0, {}
    while True:
        j = txt.find('{"label"', i)
        if j < 0:
            return out
        try:
            d, i = dec.raw_decode(txt, j)
            out[d["label"]] = d
        except ValueError:  # a case that failed (its sweep printed nothing): skipped
            i = j + 1


def main(argv):
    if len(argv) < 3 or len(argv) % 3:
        sys.exit(__doc__)
    print("| shape | dtype, ring | link only ms | best fixed ms (share) | auto ms (share) | auto / best "
          "| GB streamed a pass | GB/s best, auto (of the combined ceiling) | of the dtype's matvec ceiling |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in range(0, len(argv), 3):
        name, cj = argv[k], json.load(open(argv[k + 2]))
        comb, h2d = cj["host_plus_h2d_gbs"], cj["pcie_h2d_pinned_64mib_gbs"]
        for label, d in records(argv[k + 1]).items():
            r = d["result"]
            runs = [x for x in r["runs"] if x["T"] == 1]
            link = [x for x in runs if x["share"] == 0]
            fixed = [x for x in runs if x["share"] > 0]
            auto = [x for x in runs if x["share"] < 0]
            if not (link and fixed and auto):
                continue
            best, a = min(fixed, key=lambda x: x["ms"]), auto[0]
            gb = d.get("gb_streamed") or link[0]["ms"] * h2d / 1e3
            mark = "" if d.get("gb_streamed") else "*"
            dt, ring = label.split("_", 1)
            ring = f"minimum ({r['ring_gb']} GB)" if ring == "min" else f"{r['ring_gb']} GB"
            rb, ra = gb / best["ms"] * 1e3, gb / a["ms"] * 1e3
            mv = cj.get(f"{dt}_matvec_plus_h2d_gbs")
            own = f"{rb / mv:.2f}, {ra / mv:.2f}" if mv else "-"
            print(f"| {name} | {dt}, {ring} | {link[0]['ms']:.1f} | {best['ms']:.1f} ({best['share']:.2f}) "
                  f"| {a['ms']:.1f} ({a['share_used']:.2f}) | {a['ms'] / best['ms']:.3f} | {gb:.2f}{mark} "
                  f"| {rb:.0f} ({rb / comb:.2f}), {ra:.0f} ({ra / comb:.2f}) | {own} |")
        mvs = "".join(f", {d} matvec + H2D {cj[d + '_matvec_plus_h2d_gbs']:.1f}" for d in ("q4", "f16")
                      if d + "_matvec_plus_h2d_gbs" in cj)
        print(f"| | ceilings: pinned H2D {h2d:.1f}, host read alone {cj['host_read_gbs']:.1f} / beside the copies "
              f"{cj['host_read_with_h2d_gbs']:.1f}, combined {comb:.1f}{mvs} GB/s | | | | | | | |")


if __name__ == "__main__":
    main(sys.argv[1:])
