#!/usr/bin/env python3
"""precache_huge.py FILE...: read files into the page cache in 2 MiB folios.

mlxcel maps its weight cache with MADV_HUGEPAGE, so a run that faults the
file in from disk gets it in 2 MiB folios, mapped one page-table entry per
2 MiB.  A plain read (cat FILE > /dev/null) fills the page cache in small
folios instead, which the run then maps 4 KiB at a time: decode measured
1.4-1.6x slower that way (docs/benchmarks.md).  So a benchmark that warms
the page cache before a run warms the weight cache the way a run reads it:
the file's clean cached pages are dropped, then faulted back in through a
mapping that asks for huge pages.  Linux only; prints one line per file on
stderr.
"""
import mmap
import os
import sys
import time

MADV_POPULATE_READ = 22  # Linux 5.14+


def warm(path):
    t0 = time.time()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if size == 0:
            return
        m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
            try:
                m.madvise(MADV_POPULATE_READ)
            except OSError:
                for off in range(0, size, 4096):
                    m[off]
        finally:
            m.close()
    finally:
        os.close(fd)
    print(f"precache_huge: {path}: {size / 2**30:.2f} GiB in {time.time() - t0:.1f} s",
          file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2 if len(sys.argv) < 2 else 0)
    for p in sys.argv[1:]:
        warm(p)
