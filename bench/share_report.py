#!/usr/bin/env python3
"""bench/share_report.py: the table of bench/share_bench.sh, from its sweeps (bench/share_sweep.c's JSON, one record a
case: {"label": "<dtype>_<ring>", "result": {...}}) and the ceilings of the same call (bench/ceilings.cu, LINK_ONLY=1).

usage: share_report.py NAME SWEEPS.jsonl CEILINGS.json [NAME SWEEPS CEILINGS ...]

Per case (T = 1, a decode step): the link alone (share 0), the best fixed share, the automatic one and their ratio;
the weights a pass streams, and the rate of both sides together against the combined ceiling (host memory read beside
pinned H2D copies, plus those copies) and, where the ceilings have it, against the dtype's own: the CPU share's q4, q8 or
f16 matvec beside the copies, plus those copies (its AVX-512 or prefetching loads read faster than the plain
reader). The bytes streamed are the link-only pass's time at the call's pinned H2D rate
(marked *: on this H200 machine the link alone ran at 0.99-1.0 of it, bench/results/link_8b 0.98), unless the sweep
names them (share_sweep's gb_streamed, from the engine's plan): then the link-only pass is given as a fraction of the
pinned H2D rate too.

Where the sweeps hold a duel (share_sweep's DUEL rounds: the automatic share and the best fixed one taking turns
alone), its median ratio is given with the rounds' spread. Where they hold the dtype all resident (label
<dtype>_res), a ring's ceiling also counts the layers it keeps resident, R ms: the all-resident step's time for the
fraction of the weights not streamed (1 - streamed / streamed at the minimum ring). No streamed layer's CPU rows can
start before their input exists, so the CPU's side takes R + f S / C (S the bytes streamed, f the CPU's share, C
the host's read rate beside the copies); the link may copy all the while, (1 - f) S / L (L its rate beside the
host's reads). The ceiling is the least over f of the larger of the two; at the minimum ring (R = 0) it is S / (C +
L), the combined ceiling.
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


def streamed_gb(r, link_ms, h2d):
    """GB a pass of sweep result r streams: the plan's, or the link-only pass's time at the pinned H2D rate."""
    return r.get("gb_streamed") or link_ms * h2d / 1e3


def resident_ceiling(gb, r_ms, cj):
    """The least ms of a pass streaming gb GB beside r_ms of resident layers (the docstring's ceiling)."""
    c, l = cj["host_read_with_h2d_gbs"], cj["h2d_with_host_read_gbs"]
    s_c, s_l = gb / c * 1e3, gb / l * 1e3
    f = min(1.0, max(0.0, (s_l - r_ms) / (s_c + s_l)))
    return max(r_ms + f * s_c, (1 - f) * s_l)


def main(argv):
    if len(argv) < 3 or len(argv) % 3:
        sys.exit(__doc__)
    print("| shape | dtype, ring | link only ms (of pinned H2D) | best fixed ms (share) | auto ms (share) | auto / best "
          "| duel: auto / best (rounds, spread) | GB streamed a pass | GB/s best, auto (of the combined ceiling) "
          "| of the dtype's matvec ceiling | best, auto of the ceiling with the resident layers' step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in range(0, len(argv), 3):
        name, cj = argv[k], json.load(open(argv[k + 2]))
        comb, h2d = cj["host_plus_h2d_gbs"], cj["pcie_h2d_pinned_64mib_gbs"]
        recs = records(argv[k + 1])
        res = {}  # dtype -> the all-resident step's ms
        for label, d in recs.items():
            if label.endswith("_res"):
                one = [x for x in d["result"]["runs"] if x["T"] == 1 and x["share"] == 0]
                if one:
                    res[label[:-4]] = one[0]["ms"]
        gb_min = {}  # dtype -> GB streamed at the minimum ring
        for label, d in recs.items():
            link = [x for x in d["result"]["runs"] if x["T"] == 1 and x["share"] == 0]
            if label.endswith("_min") and link:
                gb_min[label[:-4]] = streamed_gb(d["result"], link[0]["ms"], h2d)
        for label, d in recs.items():
            if label.endswith("_res"):
                continue
            r = d["result"]
            runs = [x for x in r["runs"] if x["T"] == 1]
            link = [x for x in runs if x["share"] == 0]
            fixed = [x for x in runs if x["share"] > 0]
            auto = [x for x in runs if x["share"] < 0]
            if not (link and fixed and auto):
                continue
            best, a = min(fixed, key=lambda x: x["ms"]), auto[0]
            dt, ring = label.split("_", 1)
            ring = f"minimum ({r['ring_gb']} GB)" if ring == "min" else f"{r['ring_gb']} GB"
            if r.get("gb_streamed", -1) == 0:  # the plan keeps every unit resident at this ring
                print(f"| {name} | {dt}, {ring} | nothing streams: the model fits ({link[0]['ms']:.1f} ms) |"
                      + " |" * 8)
                continue
            gb = streamed_gb(r, link[0]["ms"], h2d)
            mark = "" if r.get("gb_streamed") else "*"
            rb, ra = gb / best["ms"] * 1e3, gb / a["ms"] * 1e3
            mv = cj.get(f"{dt}_matvec_plus_h2d_gbs")
            own = f"{rb / mv:.2f}, {ra / mv:.2f}" if mv else "-"
            du = [x for x in r.get("duels", []) if x["T"] == 1 and not x.get("null")]
            duel = (f"{du[0]['ratio']:.3f} vs {du[0]['best_share']:.2f} ({du[0]['rounds']}, "
                    f"{du[0]['ratio_min']:.3f}-{du[0]['ratio_max']:.3f})") if du else "-"
            withres = "-"
            if dt in res and dt in gb_min:
                ceil_ms = resident_ceiling(gb, res[dt] * max(0.0, 1 - gb / gb_min[dt]), cj)
                withres = f"{ceil_ms / best['ms']:.2f}, {ceil_ms / a['ms']:.2f}"
            lk = f" ({gb / link[0]['ms'] * 1e3 / h2d:.2f})" if not mark else ""
            print(f"| {name} | {dt}, {ring} | {link[0]['ms']:.1f}{lk} | {best['ms']:.1f} ({best['share']:.2f}) "
                  f"| {a['ms']:.1f} ({a['share_used']:.2f}) | {a['ms'] / best['ms']:.3f} | {duel} | {gb:.2f}{mark} "
                  f"| {rb:.0f} ({rb / comb:.2f}), {ra:.0f} ({ra / comb:.2f}) | {own} | {withres} |")
        mvs = "".join(f", {d} matvec + H2D {cj[d + '_matvec_plus_h2d_gbs']:.1f}" for d in ("q4", "q8", "f16")
                      if d + "_matvec_plus_h2d_gbs" in cj)
        rs = "".join(f", {d} all resident {v:.2f} ms" for d, v in res.items())
        print(f"| | ceilings: pinned H2D {h2d:.1f}, host read alone {cj['host_read_gbs']:.1f} / beside the copies "
              f"{cj['host_read_with_h2d_gbs']:.1f}, combined {comb:.1f}{mvs} GB/s{rs} | | | | | | | | | |")


if __name__ == "__main__":
    main(sys.argv[1:])
