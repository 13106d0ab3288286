#!/usr/bin/env python3
"""Makes a control vector for djinn --steer from two sets of prompts: the mean difference of their activations.

    tools/make_cvector.py MODEL LAYER POSITIVE.txt NEGATIVE.txt OUT.bin [--djinn ./djinn] [-- DJINN OPTIONS]

Each line of POSITIVE.txt and NEGATIVE.txt is a prompt. Each prompt is prefilled alone (djinn MODEL -p PROMPT -n 0
--dump-act LAYER ...) and its residual stream after LAYER averaged over its positions, BOS's left out (the same
for every prompt); the vector is the mean over the positive prompts minus the mean over the negative ones, written
as dim float32 values (the format --steer reads). Then `djinn MODEL --steer LAYER:OUT.bin[:SCALE]` pushes the
generation toward the positive prompts (a negative SCALE, away). The vector's norm is printed beside the typical
norm of a row at that layer, to choose SCALE by. Options after `--` go to every djinn run (--cpu, -c ...).
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from read_act import np, read_act  # noqa: E402  (numpy's import error is read_act's)


def prompt_means(djinn, model, layer, path, extra, tmp):
    with open(path, encoding="utf-8") as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        sys.exit(f"make_cvector.py: {path} holds no prompt")
    means, norms = [], []
    for i, p in enumerate(prompts):
        out = os.path.join(tmp, f"act{i}.bin")
        cmd = [djinn, model, "-p", p, "-n", "0", "--dump-act", str(layer), out] + extra
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode:
            sys.exit(f"make_cvector.py: {' '.join(cmd)} failed:\n{r.stderr}")
        d = read_act(out)
        rows = d.x[1:, 0] if d.pos.size > 1 else d.x[:, 0]  # BOS's row is every prompt's
        means.append(rows.astype(np.float64).mean(axis=0))
        norms.append(np.linalg.norm(rows.astype(np.float64), axis=1).mean())
    return np.mean(means, axis=0), float(np.mean(norms)), len(prompts)


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        k = argv.index("--")
        argv, extra = argv[:k], argv[k + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("layer", type=int)
    ap.add_argument("positive")
    ap.add_argument("negative")
    ap.add_argument("out")
    ap.add_argument("--djinn", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "djinn"))
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cvector") as tmp:
        mp, norm_p, n_p = prompt_means(a.djinn, a.model, a.layer, a.positive, extra, tmp)
        mn, norm_n, n_n = prompt_means(a.djinn, a.model, a.layer, a.negative, extra, tmp)
    v = (mp - mn).astype("<f4")
    if not np.all(np.isfinite(v)):
        sys.exit("make_cvector.py: the activations hold NaN or infinity")
    tmp_out = a.out + ".tmp"
    v.tofile(tmp_out)
    os.replace(tmp_out, a.out)
    print(f"{a.out}: layer {a.layer}, {v.size} floats from {n_p} positive and {n_n} negative prompts; "
          f"norm {np.linalg.norm(v):.4f} (a row at this layer: {(norm_p + norm_n) / 2:.4f})")


if __name__ == "__main__":
    main()
