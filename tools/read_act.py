#!/usr/bin/env python3
"""Reads an activation dump of djinn --dump-act (format: probe.h, README) into numpy.

    import sys; sys.path.insert(0, "tools")
    from read_act import read_act
    d = read_act("act.bin")
    d.x        # (positions, layers dumped, dim) float32: the residual stream after each dumped layer
    d.layers   # the layers dumped, ascending (d.x[:, i] is layer d.layers[i])
    d.pos      # (positions,) the positions, ascending
    d.tokens   # (positions,) the token at each

Records are ordered as computed (pass by pass, layer by layer); they are sorted here. A position computed twice in
one slot (a server slot reused) keeps its last rows; a (position, layer) never recorded is NaN.

Command line: tools/read_act.py FILE [--slot S] [--npz OUT]: a summary (the RMS of each dumped layer's rows), and
with --npz the arrays x, layers, pos, tokens saved for numpy.load.
"""
import argparse
import sys
from types import SimpleNamespace

try:
    import numpy as np
except ImportError:
    sys.exit("read_act.py needs numpy (Debian: apt-get install python3-numpy)")

MAGIC = b"DJINNACT"
VERSION = 1


def read_act(path, slot=0):
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size < 64 or raw[:8].tobytes() != MAGIC:
        raise ValueError(f"{path}: not a djinn activation dump (no DJINNACT header)")
    version, header, dim, n_layers = (int(v) for v in raw[8:24].view("<u4"))
    n_records, record_bytes = (int(v) for v in raw[24:40].view("<u8"))
    if version != VERSION:
        raise ValueError(f"{path}: dump version {version}, this script reads {VERSION}")
    if record_bytes != 16 + 4 * dim or raw.size != header + n_records * record_bytes:
        raise ValueError(f"{path}: {raw.size} bytes do not hold {n_records} records of {record_bytes} bytes: truncated?")
    mask = np.unpackbits(raw[64:64 + 128], bitorder="little")[:n_layers]
    layers = np.flatnonzero(mask)
    rec = np.dtype([("layer", "<u4"), ("pos", "<u4"), ("token", "<i4"), ("slot", "<u4"), ("x", "<f4", (dim,))])
    r = raw[header:].view(rec)
    r = r[r["slot"] == slot]
    pos = np.unique(r["pos"])
    x = np.full((pos.size, layers.size, dim), np.nan, dtype=np.float32)
    tokens = np.full(pos.size, -1, dtype=np.int32)
    pi = np.searchsorted(pos, r["pos"])
    li = np.searchsorted(layers, r["layer"])
    x[pi, li] = r["x"]  # later records overwrite earlier ones
    tokens[pi] = r["token"]
    return SimpleNamespace(x=x, layers=layers, pos=pos, tokens=tokens, dim=dim, n_layers=n_layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--slot", type=int, default=0, help="the KV slot whose rows to read (the CLI's: 0)")
    ap.add_argument("--npz", help="save x, layers, pos, tokens here")
    a = ap.parse_args()
    d = read_act(a.file, a.slot)
    print(f"{a.file}: dim {d.dim}, {d.pos.size} positions, layers {', '.join(map(str, d.layers))} of {d.n_layers}")
    for i, l in enumerate(d.layers):
        rms = np.sqrt(np.nanmean(d.x[:, i].astype(np.float64) ** 2))
        print(f"  layer {l:3d}: RMS {rms:.4f}")
    if a.npz:
        np.savez(a.npz, x=d.x, layers=d.layers, pos=d.pos, tokens=d.tokens)


if __name__ == "__main__":
    main()
