#!/usr/bin/env python3
"""ncu_sass_counts.py - where one kernel launch's instructions go, from
Nsight Compute's per-instruction source counters.

    ncu --graph-profiling node -k regex:'^k_moe1s$' --launch-skip 48 \\
        --launch-count 1 --section SourceCounters -o REP \\
        mlxcel bench -m /tmp/q15 --device cuda -p 100 -n 8 -r 1 --bw-mb 0
    ncu -i REP.ncu-rep --page source --csv --print-source sass > k.csv
    python3 tools/ncu_sass_counts.py k.csv [--ops N] [--list COUNT]

A kernel's instructions fall into groups by how many times each one ran:
once a warp (its prologue), once an item of its walk, once a group of
rows, ...  Instructions that ran the same number of times are listed
together: that count, how many instructions of the code ran it, the warp
instructions they make and their share, and the warp-stall samples that
landed on them (docs/cuda.md, session 27).  Then the opcodes that ran most
(--ops N, default 20), and with --list COUNT the code of the instructions
that ran COUNT times, in program order."""
import csv
import signal
import sys
from collections import Counter


def usage(code):
    print(__doc__.strip(), file=sys.stderr if code else sys.stdout)
    sys.exit(code)


def opcode(src):
    """The opcode of a SASS line without predicate or modifiers."""
    words = src.split()
    if words and words[0].startswith('@'):
        words = words[1:]
    return words[0].split('.')[0] if words else '?'


def main(argv):
    if len(argv) < 2 or argv[1] in ('-h', '--help'):
        usage(0 if len(argv) >= 2 else 2)
    path, nops, listing = argv[1], 20, None
    i = 2
    while i < len(argv):
        if argv[i] == '--ops' and i + 1 < len(argv):
            nops = int(argv[i + 1])
        elif argv[i] == '--list' and i + 1 < len(argv):
            listing = int(argv[i + 1])
        else:
            print('ncu_sass_counts: unknown argument %s' % argv[i], file=sys.stderr)
            usage(2)
        i += 2
    with open(path, newline='') as f:
        rows = list(csv.reader(f))
    # ncu's csv: a line naming the kernel, then the header, then one row an instruction
    head = next((k for k, r in enumerate(rows) if 'Source' in r and 'Instructions Executed' in r), None)
    if head is None:
        sys.exit('ncu_sass_counts: %s has no "Source" and "Instructions Executed" columns '
                 '(ncu -i REP --page source --csv --print-source sass)' % path)
    hdr = rows[head]
    i_src, i_exe = hdr.index('Source'), hdr.index('Instructions Executed')
    i_smp = hdr.index('Warp Stall Sampling (All Samples)') if 'Warp Stall Sampling (All Samples)' in hdr else None
    code = []
    for r in rows[head + 1:]:
        if len(r) <= max(i_src, i_exe):
            continue
        try:
            n = int(r[i_exe].replace(',', '') or 0)
        except ValueError:
            continue
        smp = int(r[i_smp] or 0) if i_smp is not None and r[i_smp].isdigit() else 0
        code.append((n, smp, r[i_src].strip()))
    if not code:
        sys.exit('ncu_sass_counts: no instructions in %s' % path)
    if head > 0 and rows[head - 1]:
        print(' '.join(rows[head - 1]))
    total = sum(n for n, _, _ in code)
    samples = sum(s for _, s, _ in code)
    print('%d warp instructions from %d instructions of code, %d stall samples' % (total, len(code), samples))
    by_count, smp_by, lines_by = Counter(), Counter(), Counter()
    for n, s, _ in code:
        by_count[n] += n
        smp_by[n] += s
        lines_by[n] += 1
    print('%10s %8s %12s %7s %8s' % ('ran', 'code', 'warp instr', 'share', 'samples'))
    for n, t in sorted(by_count.items(), key=lambda kv: -kv[1]):
        if n == 0 or t < total / 1000:
            continue
        print('%10d %8d %12d %6.1f%% %8d' % (n, lines_by[n], t, 100.0 * t / total, smp_by[n]))
    ops = Counter()
    for n, _, src in code:
        ops[opcode(src)] += n
    print('\nopcodes')
    for op, t in ops.most_common(nops):
        print('%-10s %12d %6.1f%%' % (op, t, 100.0 * t / total))
    if listing is not None:
        print('\ninstructions that ran %d times (samples, code)' % listing)
        for n, s, src in code:
            if n == listing:
                print('%5d  %s' % (s, src))


if __name__ == '__main__':
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # quiet under | head
    main(sys.argv)
