#!/usr/bin/env python3
"""cuda_trace_step.py - where a captured decode step's time goes, from a
tools/cuda_trace.c CSV: per kernel name, what it adds to a step (its end
minus the previous kernel's end, the median over the steps) and its own
duration, and the host's side of a step (the graph launch, the wait, the
time from the wait's return to the next launch).

    python3 tools/cuda_trace_step.py trace.csv [--skip N]

Steps are the graph launches (cudaGraphLaunch); the first --skip (default
3) are left out (capture, warm-up)."""
import csv
import statistics
import sys
from collections import defaultdict


def main():
    args = sys.argv[1:]
    skip = 3
    if '--skip' in args:
        i = args.index('--skip')
        skip = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 1:
        sys.exit(__doc__)
    rows = [r for r in csv.reader(open(args[0])) if r]
    ev = sorted(((r[0], int(r[1]), int(r[2]), r) for r in rows), key=lambda x: x[1])
    launches = [e for e in ev if e[0] == 'R' and 'GraphLaunch' in e[3][-1]]
    syncs = [e for e in ev if e[0] == 'R' and 'Synchronize' in e[3][-1]]
    kernels = [e for e in ev if e[0] == 'K' and e[3][7] != '0']   # inside a graph
    if len(launches) < skip + 3:
        sys.exit('cuda_trace_step: fewer than %d graph launches in %s' % (skip + 3, args[0]))
    # the steps: a launch's graph kernels, before the next launch (a window
    # with another count of kernels, a prompt between two runs say, is left out)
    steps = []
    for a, b in zip(launches[skip:-1], launches[skip + 1:]):
        steps.append((a, b, [k for k in kernels if a[1] <= k[1] < b[1]]))
    usual = statistics.mode(len(ks) for _, _, ks in steps)
    add = defaultdict(list)     # (index in step, name) -> what it adds, ns
    own = defaultdict(list)
    host = defaultdict(list)
    for a, b, ks in steps:
        if len(ks) != usual or not ks:
            continue
        prev = ks[0][1]
        for i, k in enumerate(ks):
            key = (i, k[3][-1])
            add[key].append(k[2] - prev)
            own[key].append(k[2] - k[1])
            prev = max(prev, k[2])
        sy = [s for s in syncs if a[1] <= s[1] < b[1]]
        host['launch call'].append(a[2] - a[1])
        host['launch to first kernel'].append(ks[0][1] - a[1])
        host['kernels (first start to last end)'].append(ks[-1][2] - ks[0][1])
        if sy:
            host['wait return to next launch'].append(b[1] - sy[-1][2])
        host['step (launch to launch)'].append(b[1] - a[1])
    per = defaultdict(lambda: [0.0, 0.0, 0])
    for (i, name), v in add.items():
        p = per[name]
        p[0] += statistics.median(v)
        p[1] += statistics.median(own[(i, name)])
        p[2] += 1
    print('%-60s %5s %10s %10s %9s %9s' % ('kernel', 'n', 'adds us', 'own us', 'adds/n', 'own/n'))
    for name, (a, o, n) in sorted(per.items(), key=lambda x: -x[1][0]):
        print('%-60s %5d %10.1f %10.1f %9.2f %9.2f' % (name[:60], n, a / 1e3, o / 1e3, a / 1e3 / n, o / 1e3 / n))
    print()
    for k, v in host.items():
        print('%-36s median %9.1f us (min %.1f, max %.1f, %d steps)' %
              (k, statistics.median(v) / 1e3, min(v) / 1e3, max(v) / 1e3, len(v)))


if __name__ == '__main__':
    main()
