#!/usr/bin/env python3
# Each register-kernel CTA's phases from qgemm_bench's QGEMM_TRACE files (fma2.patch, QREG_TRACE=1): microseconds
# from the first CTA's entry, min / median / max over the CTAs of token block 0.
#   python3 trace_phases.py DIR
import glob, sys
def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))]
names = ['pdl_wait returned', 'first unit landed', 'first sums start', 'first sums done', 'end']
for f in sorted(glob.glob(sys.argv[1] + '/tr_*.txt')):
    lines = open(f).read().split('\n')
    rows = [list(map(int, l.split())) for l in lines[1:] if l.strip()]
    if not rows:
        continue
    t0 = min(r[1] for r in rows)
    units = sorted(set(r[7] for r in rows))
    out = [f"{n} {q([(r[i + 2] - t0) / 1e3 for r in rows], 0):.1f}/{q([(r[i + 2] - t0) / 1e3 for r in rows], .5):.1f}/"
           f"{q([(r[i + 2] - t0) / 1e3 for r in rows], 1):.1f}" for i, n in enumerate(names)]
    print(f"{f.split('/')[-1][3:-4]:22s} {len(rows):3d} CTAs, {units[0]}-{units[-1]} units | " + " | ".join(out))
