#!/usr/bin/env python3
"""Turns the raw results of bench/run_gpu_bench.sh into one JSON, charts and Markdown tables.

usage: python3 bench/report.py RAW_DIR OUT_DIR     writes OUT_DIR/gpu_bench.json, gpu_bench.md, stream_<m>.png,
                                                  resident_<m>.png, and prints the tables
       python3 bench/report.py --summary RAW_DIR   prints the tables of whatever RAW_DIR holds so far

RAW_DIR holds: ceilings.json (bench/ceilings.cu), machine.json, config_<m>.json (each model's HF config),
djinn_<m>_<case>.json (./djinn --stats-json plus the harness's case/args), hf_<m>_<mode>.json
(bench/hf_baseline.py), convert_<m>.json. <m> is the model tag: 7b, 13b or tiny.

Definitions (also written into the JSON):
  weight GB/token   bytes of weights a decode step reads: every layer + final norm + lm_head (the embedding
                    table is gathered one row per token and not counted); from the model's config, f16
  streamed GB/token bytes copied host-to-device per decode token (djinn's plan; HF: the weights not on the GPU,
                    all of them for cpu_offload, embedding included)
  CPU GB/token      djinn's CPU share (share_* cases, --cpu-share): bytes of the streamed matrices the CPU reads
                    from host memory per decode token instead of copying them
  effective GB/s    resident: weight GB/token / s per token (vs the D2D copy ceiling);
                    streamed: (streamed + CPU GB/token) / s per token, vs the pinned H2D ceiling with the link
                    alone, vs the combined ceiling with a CPU share (host memory read while H2D copies run, plus
                    those copies: ceilings.cu's host_plus_h2d_gbs; the H2D ceiling where it was not measured)
  bound ms          max(streamed (+ CPU) GB / that ceiling, weight GB / D2D peak): copies and compute overlap, so
                    the slower of the host side and the HBM reads bounds a token; of_bound = bound / measured
  prefill TFLOP/s   (2 T P + 2 L T^2 H d + 2 dim vocab) / prefill s, P = matmul weights per layer x L, causal
                    attention counted once (T^2/2 per QK^T and PV), lm_head for the last row only
  vs cpu_offload    HF cpu_offload ms/token / this case's ms/token, same model
"""
import datetime
import glob
import json
import os
import sys

TAG_ORDER = ["tiny", "7b", "13b"]
HF_ORDER = ["gpu", "auto", "cpu_offload"]


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as ex:
        print(f"report: cannot read {path}: {ex}", file=sys.stderr)
        return None


def pick(d, names, contains):
    """A ceiling by its known key, else by the first numeric key containing every word of `contains`."""
    if not d:
        return None
    for k in names:
        if isinstance(d.get(k), (int, float)):
            return float(d[k])
    for k, v in d.items():
        if isinstance(v, (int, float)) and all(w in k.lower() for w in contains):
            return float(v)
    return None


def shape_of(cfg):
    dim, L, H = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or H
    hd = cfg.get("head_dim") or dim // H
    ffn, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    w = 2  # f16 weights; norms are f32 in model.bin
    mm = dim * H * hd + 2 * dim * kv * hd + H * hd * dim + 3 * dim * ffn  # matmul weights per layer
    layer = 2 * dim * 4 + w * mm
    head = dim * 4 + w * vocab * dim
    return dict(dim=dim, layers=L, heads=H, kv_heads=kv, head_dim=hd, ffn=ffn, vocab=vocab, matmul_params_layer=mm,
                weight_gb_per_token=(L * layer + head) / 1e9, embed_gb=w * vocab * dim / 1e9,
                model_gb=(L * layer + head + w * vocab * dim) / 1e9)


def prefill_flops(s, T):
    return 2 * T * s["matmul_params_layer"] * s["layers"] + 2 * s["layers"] * T * T * s["heads"] * s["head_dim"] \
        + 2 * s["dim"] * s["vocab"]


def ratio(a, b):
    return a / b if a is not None and b else None


def gather(raw):
    c = load_json(os.path.join(raw, "ceilings.json")) if os.path.exists(os.path.join(raw, "ceilings.json")) else None
    ceil = dict(d2d_gb_s=pick(c, ["hbm_d2d_gbs"], ["d2d"]),
                h2d_pinned_gb_s=pick(c, ["pcie_h2d_pinned_64mib_gbs"], ["h2d"]),
                gemm_f16_tflops=pick(c, ["cublas_f16_gemm_8192_tflops"], ["gemm", "tflops"]),
                host_read_gb_s=pick(c, ["host_read_gbs"], ["host_read_gbs"]),
                combined_gb_s=pick(c, ["host_plus_h2d_gbs"], ["host_plus_h2d"]), raw=c)
    machine = load_json(os.path.join(raw, "machine.json")) if os.path.exists(os.path.join(raw, "machine.json")) else None
    models = {}
    for p in glob.glob(os.path.join(raw, "config_*.json")):
        tag = os.path.basename(p)[len("config_"):-len(".json")]
        cfg = load_json(p)
        if cfg:
            models[tag] = shape_of(cfg)
            cv = os.path.join(raw, f"convert_{tag}.json")
            if os.path.exists(cv):
                models[tag]["convert"] = load_json(cv)
    cases = []
    for p in sorted(glob.glob(os.path.join(raw, "djinn_*.json")) + glob.glob(os.path.join(raw, "hf_*.json"))):
        d = load_json(p)
        if not d:
            continue
        base = os.path.basename(p)[:-len(".json")]
        kind, tag, name = base.split("_", 2)
        d.setdefault("tag", tag)
        d["case"] = name if kind == "djinn" else "hf_" + name
        d["engine"] = "djinn" if kind == "djinn" else "hf"
        cases.append(d)
    return ceil, machine, models, cases


def derive(ceil, models, cases):
    d2d, h2d, gemm = ceil["d2d_gb_s"], ceil["h2d_pinned_gb_s"], ceil["gemm_f16_tflops"]
    offload_ms = {c["tag"]: c.get("decode_ms_per_token") for c in cases if c["case"] == "hf_cpu_offload"}
    for c in cases:
        s = models.get(c["tag"])
        ms = c.get("decode_ms_per_token") or None
        sec = ms / 1e3 if ms else None
        wgb = s["weight_gb_per_token"] if s else None
        if c["engine"] == "djinn":
            sgb = c.get("streamed_gb_per_token") or 0.0
        else:
            sgb = c.get("weight_gb_streamed") or 0.0
        c["weight_gb_per_token"] = wgb
        c["streamed_gb_per_token"] = sgb
        c["cpu_gb_per_token"] = cgb = c.get("cpu_gb_per_token") or 0.0
        c["effective_weight_gb_s"] = wgb / sec if wgb and sec else None
        c["weight_of_d2d"] = ratio(c["effective_weight_gb_s"], d2d)
        # the streamed weights' ceiling: the link alone, or with a CPU share the host's reads and the link together
        host = ceil.get("combined_gb_s") if cgb and ceil.get("combined_gb_s") else h2d
        c["streamed_ceiling"] = "host read + H2D" if cgb and ceil.get("combined_gb_s") else "H2D"
        c["effective_h2d_gb_s"] = (sgb + cgb) / sec if sgb and sec else None
        c["h2d_of_peak"] = ratio(c["effective_h2d_gb_s"], host)
        if wgb and host and d2d:
            c["bound_ms"] = 1e3 * max((sgb + cgb) / host, wgb / d2d)
            c["of_bound"] = c["bound_ms"] / ms if ms else None
        else:
            c["bound_ms"] = c["of_bound"] = None
        T = c.get("prompt_tokens")
        if s and T and c.get("prefill_s"):
            c["prefill_tflops"] = prefill_flops(s, T) / c["prefill_s"] / 1e12
            c["prefill_of_gemm"] = ratio(c["prefill_tflops"], gemm)
        else:
            c["prefill_tflops"] = c["prefill_of_gemm"] = None
        off = offload_ms.get(c["tag"])
        c["speedup_vs_cpu_offload"] = off / ms if off and ms else None
        if c["engine"] == "djinn":
            rg = c.get("ring_gb") or 0
            c["ring_label"] = "fits" if not rg else f"{rg:g}"
        else:
            c["ring_label"] = {"gpu": "all on GPU", "cpu_offload": "0 (all CPU)"}.get(
                c.get("mode"), f"{c.get('max_memory_gpu_bytes', 0) / 1e9:g}")


RESIDENT = ("fits", "fits_short", "fits_fma")  # all resident (_fma: prefill attention on the FMA kernel)


def order_key(c):
    t = TAG_ORDER.index(c["tag"]) if c["tag"] in TAG_ORDER else 9
    name = c["case"]
    if c["engine"] == "hf":
        k = 100 + (HF_ORDER.index(c.get("mode")) if c.get("mode") in HF_ORDER else 9)
    elif name in RESIDENT + ("ring_min",):
        k = (RESIDENT + ("ring_min",)).index(name)
    else:  # ring_<G>, then stream_all_<G>, then sync_copy_<G>, then share_<G>, each by G
        pre = ("ring_", "stream_all_", "sync_copy_", "share_", "share")
        k = 10 * (1 + [name.startswith(p) for p in pre].index(True)) if any(name.startswith(p) for p in pre) else 90
        k += min((c.get("ring_gb") or 0) / 1000, 9)
    return (t, k, name)


def targets(cases, ceil):
    out = []
    by = {(c["tag"], c["case"]): c for c in cases}

    def add(name, value, want, ok):
        out.append(dict(target=name, value=value, want=want, passed=None if value is None else ok(value)))

    for tag in ("7b", "13b", "tiny"):
        for case in ("fits_short", "fits"):
            fits = by.get((tag, case))
            if fits:
                add(f"{tag} resident decode weight GB/s of D2D ({case})", fits["weight_of_d2d"], ">= 0.80",
                    lambda v: v >= 0.8)
                break
        for case in ("fits", "fits_fma"):
            if by.get((tag, case)):
                add(f"{tag} prefill 512 TFLOP/s of GEMM peak ({case})", by[(tag, case)]["prefill_of_gemm"], ">= 0.50",
                    lambda v: v >= 0.5)
        if by.get((tag, "ring_min")):
            c = by[(tag, "ring_min")]
            add(f"{tag} all-streamed effective H2D of peak", c["h2d_of_peak"], ">= 0.90", lambda v: v >= 0.9)
            add(f"{tag} all-streamed, link only (--cpu-share 0), speedup vs HF cpu_offload",
                c["speedup_vs_cpu_offload"], ">= 7", lambda v: v >= 7)
        if by.get((tag, "share_min")):
            add(f"{tag} minimum ring, default engine (CPU share auto), speedup vs HF cpu_offload",
                by[(tag, "share_min")]["speedup_vs_cpu_offload"], ">= 7", lambda v: v >= 7)
        for name in ("ring_4", "ring_8", "ring_16"):
            c = by.get((tag, name))
            if c and c.get("streamed_units"):
                add(f"{tag} {name} partial residency ms within 10% of bound", c["of_bound"], ">= 0.909",
                    lambda v: v >= 1 / 1.1)
            if c and name == "ring_16":
                add(f"{tag} {name} speedup vs HF cpu_offload", c["speedup_vs_cpu_offload"], ">= 7", lambda v: v >= 7)
    return out


def f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def pct(v):
    return "-" if v is None else f"{100 * v:.0f}%"


def tables(ceil, models, cases, tg):
    lines = []
    lines.append(f"Ceilings (same run): D2D copy {f(ceil['d2d_gb_s'], '{:.0f}')} GB/s, pinned H2D "
                 f"{f(ceil['h2d_pinned_gb_s'], '{:.1f}')} GB/s, cuBLAS f16 GEMM {f(ceil['gemm_f16_tflops'], '{:.0f}')} "
                 "TFLOP/s" + (f", host memory read {f(ceil['host_read_gb_s'], '{:.1f}')} GB/s, host read + H2D together "
                              f"{f(ceil['combined_gb_s'], '{:.1f}')} GB/s" if ceil.get("combined_gb_s") else ""))
    for tag in sorted(models, key=lambda t: TAG_ORDER.index(t) if t in TAG_ORDER else 9):
        s = models[tag]
        lines.append(f"Model {tag}: {s['model_gb']:.2f} GB f16, {s['weight_gb_per_token']:.2f} GB of weights read "
                     f"per decode token")
    lines.append("")
    res = [c for c in cases if c["engine"] == "hf" and c.get("mode") == "gpu" or
           c["engine"] == "djinn" and c["case"] in RESIDENT]
    if res:
        lines.append("| model | engine | case | prompt | decode ms/token | tok/s | weight GB/s | of D2D | "
                     "prefill tok/s | TFLOP/s | of GEMM | TTFT ms | load s (GB/s) |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for c in res:
            short = c["case"].startswith("fits_short")
            lines.append(
                f"| {c['tag']} | {c['engine']} | {c['case']} | {c.get('prompt_tokens', '-')} | "
                f"{f(c.get('decode_ms_per_token'))} | {f(c.get('decode_tok_s'), '{:.1f}')} | "
                f"{f(c['effective_weight_gb_s'], '{:.0f}')} | {pct(c['weight_of_d2d'])} | "
                f"{'-' if short else f(c.get('prefill_tok_s'), '{:.0f}')} | "
                f"{'-' if short else f(c['prefill_tflops'], '{:.1f}')} | {'-' if short else pct(c['prefill_of_gemm'])} | "
                f"{f(c.get('ttft_ms'), '{:.1f}')} | {f(c.get('load_s'), '{:.1f}')} ({f(c.get('load_gb_s'), '{:.1f}')}) |")
        lines.append("")
    st = [c for c in cases if c not in res or c["case"] == "fits"]
    if st:
        lines.append("| model | engine | case | ring GB | units res/str | streamed GB/token | CPU GB/token | ms/token | "
                     "eff GB/s | of ceiling (which) | bound ms | of bound | vs cpu_offload | TTFT ms | load s (GB/s) |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for c in st:
            units = f"{c['resident_units']}/{c['streamed_units']}" if "resident_units" in c else "-"
            lines.append(
                f"| {c['tag']} | {c['engine']} | {c['case']} | {c['ring_label']} | {units} | "
                f"{f(c['streamed_gb_per_token'])} | {f(c['cpu_gb_per_token']) if c['cpu_gb_per_token'] else '-'} | "
                f"{f(c.get('decode_ms_per_token'), '{:.1f}')} | "
                f"{f(c['effective_h2d_gb_s'], '{:.1f}')} | {pct(c['h2d_of_peak'])} ({c['streamed_ceiling']}) | "
                f"{f(c['bound_ms'], '{:.1f}')} | "
                f"{pct(c['of_bound'])} | {f(c['speedup_vs_cpu_offload'], '{:.1f}x')} | "
                f"{f(c.get('ttft_ms'), '{:.0f}')} | {f(c.get('load_s'), '{:.1f}')} ({f(c.get('load_gb_s'), '{:.1f}')}) |")
        lines.append("")
    if tg:
        lines.append("| target | value | want | met |")
        lines.append("|---|---|---|---|")
        for t in tg:
            met = {True: "yes", False: "NO", None: "-"}[t["passed"]]
            lines.append(f"| {t['target']} | {f(t['value'], '{:.3f}')} | {t['want']} | {met} |")
        lines.append("")
    notes = sorted({f"{c['tag']} {c['case']}: {c['note']}" for c in cases if c.get("note")})
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines)


def charts(out_dir, ceil, models, cases):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: no matplotlib: charts skipped", file=sys.stderr)
        return []
    written = []
    for tag, s in models.items():
        mine = [c for c in cases if c["tag"] == tag]
        dj = [c for c in mine if c["engine"] == "djinn" and c.get("decode_ms_per_token")]
        hf = [c for c in mine if c["engine"] == "hf" and c.get("decode_ms_per_token")]
        plain = [c for c in dj if not c.get("stream_all") and not c.get("sync_copy") and c["case"] != "fits_short"
                 and not c["case"].endswith("_fma")
                 and not c["case"].startswith("share")]
        shared = sorted(((c.get("ring_gb") or 0), c) for c in dj if c["case"].startswith("share_"))
        if any(c.get("streamed_units") for c in dj):
            fig, ax = plt.subplots(figsize=(8, 5))
            pts = sorted(((c.get("ring_gb") or s["weight_gb_per_token"]), c) for c in plain)
            xs = [x for x, _ in pts]
            ax.plot(xs, [c["decode_ms_per_token"] for _, c in pts], "o-", color="C0", label="djinn, link only (--cpu-share 0)")
            for x, c in pts:
                ax.annotate(c["case"], (x, c["decode_ms_per_token"]), textcoords="offset points", xytext=(4, 6),
                            fontsize=8)
            if all(c["bound_ms"] for _, c in pts) and pts:
                ax.plot(xs, [c["bound_ms"] for _, c in pts], "k--", marker="_", label="bound: max(streamed/H2D, "
                        "weights/D2D)")
            if shared:
                ax.plot([x for x, _ in shared], [c["decode_ms_per_token"] for _, c in shared], "D-", color="C1",
                        label="djinn, default CPU share (auto): part of each streamed matrix computed by the CPU")
                for x, c in shared:
                    ax.annotate(f"share {c.get('cpu_share', 0):.2f}", (x, c["decode_ms_per_token"]),
                                textcoords="offset points", xytext=(4, -12), fontsize=8, color="C1")
            for c, m, lab in [(c, "^", "djinn --stream-all") for c in dj if c.get("stream_all")] + \
                             [(c, "s", "djinn --sync-copy") for c in dj if c.get("sync_copy")]:
                ax.plot([c.get("ring_gb") or 0], [c["decode_ms_per_token"]], m, color="C3" if m == "s" else "C2",
                        label=f"{lab} (ring {c.get('ring_gb', 0):g})")
            for i, c in enumerate(hf):
                lab = {"gpu": "HF, all on GPU", "cpu_offload": "HF accelerate cpu_offload"}.get(
                    c["mode"], f"HF device_map=auto, {c.get('max_memory_gpu_bytes', 0) / 1e9:g} GB on GPU")
                ax.axhline(c["decode_ms_per_token"], color=f"C{4 + i}", ls=":", label=lab)
            ax.set_yscale("log")
            ax.set_xlabel("GPU memory for weights, GB (--ring-gb; 'fits' plotted at the model's weight size)")
            ax.set_ylabel("decode ms/token (log)")
            h2d = ceil["h2d_pinned_gb_s"]
            ax.set_title(f"Llama-2-{tag.upper()}-shaped, f16 ({s['weight_gb_per_token']:.1f} GB/token of weights)"
                         + (f"; pinned H2D {h2d:.1f} GB/s" if h2d else ""))
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
            p = os.path.join(out_dir, f"stream_{tag}.png")
            fig.tight_layout()
            fig.savefig(p, dpi=120)
            plt.close(fig)
            written.append(p)
        res = [c for c in dj if c["case"] in RESIDENT] + [c for c in hf if c.get("mode") == "gpu"]
        if res:
            fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 5))
            def label(c):  # engine, what it ran with, prompt length: one short line each
                how = {"fits": "default", "fits_short": "default", "fits_fma": "--fma-attn"}.get(c["case"], c["case"])
                return f"{c['engine']}\n{how}\nprompt {c.get('prompt_tokens')}"
            names = [label(c) for c in res]
            bars = a1.bar(names, [c["decode_ms_per_token"] for c in res],
                          color=["C0" if c["engine"] == "djinn" else "C4" for c in res])
            a1.bar_label(bars, fmt="%.2f", fontsize=8)
            if ceil["d2d_gb_s"]:
                a1.axhline(1e3 * s["weight_gb_per_token"] / ceil["d2d_gb_s"], color="k", ls="--",
                           label=f"weights / D2D ({ceil['d2d_gb_s']:.0f} GB/s)")
                a1.legend(fontsize=8)
            a1.set_ylabel("decode ms/token")
            a1.set_title("decode, all resident")
            pre = [c for c in res if c.get("prefill_tflops") and not c["case"].startswith("fits_short")]
            bars = a2.bar([label(c) for c in pre],
                          [c["prefill_tflops"] for c in pre],
                          color=["C0" if c["engine"] == "djinn" else "C4" for c in pre])
            a2.bar_label(bars, fmt="%.0f", fontsize=8)
            if ceil["gemm_f16_tflops"]:
                a2.axhline(ceil["gemm_f16_tflops"], color="k", ls="--", label="cuBLAS f16 GEMM peak")
                a2.legend(fontsize=8)
            a2.set_ylabel("prefill TFLOP/s")
            a2.set_title("prefill")
            for a in (a1, a2):
                a.tick_params(axis="x", labelsize=8)
            fig.suptitle(f"Llama-2-{tag.upper()}-shaped, f16, all resident")
            fig.tight_layout()
            p = os.path.join(out_dir, f"resident_{tag}.png")
            fig.savefig(p, dpi=120)
            plt.close(fig)
            written.append(p)
    return written


DEFINITIONS = {
    "weight_gb_per_token": "weights read by one decode step: all layers + final norm + lm_head (f16; norms f32); "
                           "the embedding table is gathered one row per token and not counted",
    "streamed_gb_per_token": "bytes copied host-to-device per decode token (djinn: its plan; HF: weights not on the "
                             "GPU, all of them incl. the embedding for cpu_offload)",
    "effective_weight_gb_s": "weight_gb_per_token / seconds per token; weight_of_d2d = that / D2D copy GB/s",
    "effective_h2d_gb_s": "streamed_gb_per_token / seconds per token; h2d_of_peak = that / pinned H2D GB/s",
    "bound_ms": "1000 * max(streamed_gb / H2D peak, weight_gb / D2D peak); of_bound = bound_ms / measured ms",
    "prefill_tflops": "(2 T P L + 2 L T^2 H d + 2 dim vocab) / prefill_s; P = matmul weights per layer, causal "
                      "attention, lm_head on the last row; prefill_of_gemm = that / cuBLAS f16 GEMM TFLOP/s",
    "speedup_vs_cpu_offload": "HF accelerate cpu_offload ms/token / this case's ms/token, same model",
    "decode_ms_per_token": "djinn: generated tokens after the first, wall time / count; HF: mean of timed steps "
                           "after one warm-up step, each with use_cache",
}


def main():
    args = sys.argv[1:]
    summary = bool(args) and args[0] == "--summary"
    if summary:
        args = args[1:]
    if len(args) != (1 if summary else 2):
        sys.exit(__doc__)
    raw = args[0]
    ceil, machine, models, cases = gather(raw)
    derive(ceil, models, cases)
    cases.sort(key=order_key)
    tg = targets(cases, ceil)
    text = tables(ceil, models, cases, tg)
    print(text)
    if summary:
        return
    out = args[1]
    os.makedirs(out, exist_ok=True)
    res = dict(generated=datetime.datetime.now().isoformat(timespec="seconds"), machine=machine,
               ceilings=ceil, definitions=DEFINITIONS, models=models, cases=cases, targets=tg)
    with open(os.path.join(out, "gpu_bench.json"), "w") as fo:
        json.dump(res, fo, indent=1)
    with open(os.path.join(out, "gpu_bench.md"), "w") as fo:
        fo.write(text + "\n")
    written = charts(out, ceil, models, cases)
    print(f"report: wrote {os.path.join(out, 'gpu_bench.json')}, gpu_bench.md" +
          "".join(f", {os.path.basename(p)}" for p in written))


if __name__ == "__main__":
    main()
