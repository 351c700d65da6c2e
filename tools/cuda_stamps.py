#!/usr/bin/env python3
"""cuda_stamps.py - where each one-token kernel's time goes inside a decode
step, from the phase stamps of a measuring build (cmake
-DCMAKE_CUDA_FLAGS=-DMXC_STAMPS; MLXCEL_CUDA_STAMPS=file mlxcel bench ...).

    python3 tools/cuda_stamps.py stamps.bin [--steps N]

Each block of the stamped kernels noted its start, its wait, the wait's
return, its trigger and its exit (src/cuda/kern.h: mxc_stamp).  Per kernel
of a step (the medians over the last N steps, default 20), in us:

  adds     its last block's exit minus its predecessor's
  release  its first wait's return minus its predecessor's last exit
  rel_med  the same for the median block
  work     its last trigger minus its first wait's return
  tail     its last exit minus its last trigger (a last block's chain)
  res      its median block's start minus its predecessor's last exit
           (negative: resident while its predecessor ran)
  pre      a block's start to its wait, the median (what it did before)

then the same summed per kernel name over a step, and the kernels' own
points (STAMP_AT(5 .. 7) in src/cuda/kernels.cu) after the first wait's
return: the median block's and the last block's (the one that left
last), with its trigger (T) and exit (X)."""
import statistics
import struct
import sys
from collections import defaultdict

REC = struct.Struct('<4I8Q4I')
NAMES = {2: 'k_mvs_rp (o_proj+router)', 3: 'k_attend', 4: 'k_moe1s (phase 1)',
         5: 'k_moe2s (phase 2)', 6: 'k_argmax', 7: 'k_embed'}


LM_HEAD = 1000   # the step's last k_mvs (before the argmax), apart from q/k/v


def name(kid):
    if kid == LM_HEAD:
        return 'lm_head (k_mvs)'
    if kid in NAMES:
        return NAMES[kid]
    if kid % 16 == 1:
        return 'k_mvs R=%d' % (kid // 16)
    return 'kid %d' % kid


def med(v):
    return statistics.median(v) if v else float('nan')


def main():
    args = sys.argv[1:]
    nsteps = 20
    if '--steps' in args:
        i = args.index('--steps')
        nsteps = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 1:
        sys.exit(__doc__)
    data = open(args[0], 'rb').read()
    (n,) = struct.unpack_from('<Q', data, 0)
    if len(data) != 8 + n * REC.size:
        sys.exit('cuda_stamps: %s holds %d bytes, not a count and %d stamps of %d bytes (a build of another '
                 'src/cuda/kern.h?)' % (args[0], len(data), n, REC.size))
    recs = [REC.unpack_from(data, 8 + i * REC.size) for i in range(n)]
    recs = [r for r in recs if r[4]]
    # fields: 0 kid, 1 blk, 2 smid, 3 nblk, 4.. 11 times, 12.. 15 clocks
    recs.sort(key=lambda r: r[4])
    lows = [r[4] % 1000 for r in recs]
    print('stamps: %d blocks; globaltimer ns mod 1000: %d distinct values, %d of them 0'
          % (len(recs), len(set(lows)), sum(1 for v in lows if v == 0)))
    # instances: runs of one kernel id in start order
    inst = []
    for r in recs:
        if inst and inst[-1][0] == r[0]:
            inst[-1][1].append(r)
        else:
            inst.append((r[0], [r]))
    # steps begin at the embedding
    steps, cur = [], None
    for kid, bl in inst:
        if kid == 7:
            if cur:
                steps.append(cur)
            cur = []
        if cur is not None:
            cur.append((kid, bl))
    if not steps:
        sys.exit('cuda_stamps: no whole step (no k_embed between two others) in %s' % args[0])
    usual = statistics.mode(len(s) for s in steps)
    steps = [s for s in steps if len(s) == usual][-nsteps:]
    print('%d steps of %d stamped kernels' % (len(steps), usual))
    cols = ('adds', 'release', 'rel_med', 'work', 'tail', 'res', 'pre')
    per = defaultdict(lambda: defaultdict(list))   # position -> metric -> values
    kind = {}
    per_pt = defaultdict(lambda: defaultdict(list))
    for s in steps:
        prev_end = None
        for i, (kid, bl) in enumerate(s):
            kind[i] = LM_HEAD if kid % 16 == 1 and i + 1 < len(s) and s[i + 1][0] == 6 else kid
            t0 = [b[4] for b in bl]
            t1 = [b[5] for b in bl if b[5]]
            t2 = [b[6] for b in bl if b[6]]
            t3 = [b[7] for b in bl if b[7]]
            end = max(b[8] for b in bl)
            w0 = min(t2) if t2 else None
            lastb = max(bl, key=lambda b: b[8])
            if w0 is not None:
                pts = per_pt[i]
                for j in (5, 6, 7):
                    v = [b[4 + j] - w0 for b in bl if b[4 + j]]
                    if v:
                        pts['med%d' % j].append(med(v))
                    if lastb[4 + j]:
                        pts['last%d' % j].append(lastb[4 + j] - w0)
                pts['lastT'].append(lastb[7] - w0 if lastb[7] else float('nan'))
                pts['lastX'].append(lastb[8] - w0)
            if prev_end is not None and t2:
                m = per[i]
                m['adds'].append(end - prev_end)
                m['release'].append(min(t2) - prev_end)
                m['rel_med'].append(med(t2) - prev_end)
                if t3:
                    m['work'].append(max(t3) - min(t2))
                    m['tail'].append(end - max(t3))
                m['res'].append(med(t0) - prev_end)
                if t1:
                    m['pre'].append(med([b[5] - b[4] for b in bl if b[5]]))
            prev_end = end
    tot = defaultdict(lambda: defaultdict(float))
    cnt = defaultdict(int)
    print('\nposition kernel                      ' + ''.join('%9s' % c for c in cols))
    for i in sorted(per):
        m = per[i]
        vals = {c: med(m[c]) / 1000.0 for c in cols}
        if i < 12 or i >= len(per) - 3:
            print('%8d %-28s' % (i, name(kind[i])) + ''.join('%9.2f' % vals[c] for c in cols))
        for c in cols:
            if vals[c] == vals[c]:
                tot[kind[i]][c] += vals[c]
        cnt[kind[i]] += 1
    print('\nper kernel, us a launch (mean over its launches of the step medians)')
    print('%-28s %4s' % ('kernel', 'n') + ''.join('%9s' % c for c in cols))
    for kid in sorted(tot, key=lambda k: -tot[k]['adds']):
        print('%-28s %4d' % (name(kid), cnt[kid]) + ''.join('%9.2f' % (tot[kid][c] / cnt[kid]) for c in cols))
    print('step: %.1f us of adds' % sum(tot[k]['adds'] for k in tot))
    keys = ('med5', 'med6', 'med7', 'last5', 'last6', 'last7', 'lastT', 'lastX')
    agg = defaultdict(lambda: defaultdict(list))
    for i, pts in per_pt.items():
        for k in keys:
            if pts[k]:
                agg[kind[i]][k].append(med(pts[k]))
    print('\npoints after the first wait return, us (median block: med5..7; the block that left last: last5..7, T, X)')
    print('%-28s' % 'kernel' + ''.join('%8s' % k for k in keys))
    for kid in sorted(agg, key=lambda k: -tot[k]['adds']):
        print('%-28s' % name(kid) + ''.join('%8.2f' % (statistics.mean(agg[kid][k]) / 1000.0) if agg[kid][k] else '%8s' % '-' for k in keys))


if __name__ == '__main__':
    main()
