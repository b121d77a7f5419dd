"""Instructions per recorded phase on the training thread, counted by callgrind.

Counting instructions (``valgrind --tool=callgrind``) gives the same figure on a busy
machine, where timings of a microsecond move by half their size. The background thread
sleeps (a flush interval of an hour, and the wake-up the training thread gives it every
1,024 records, to keep the spool tail's ring from wrapping, turned off here) and the
process ends with ``os._exit``, so only the training thread's work is in the difference
between two runs::

    for n in 0 20000; do
      PYTHONPATH=src valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/ir_phase.py $n 2>&1 | grep Collected
    done
    # instructions per phase = (Collected at 20000 - Collected at 0) / 20000

Point ``PYTHONPATH`` at another checkout's ``src`` to compare two versions of the recorder.
"""

from __future__ import annotations

import os
import sys
import tempfile

import goodput

n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
rec = goodput.configure("ir", run_dir=tempfile.mkdtemp(), flush_interval_s=3600)
rec._wake.set = lambda: None  # the background thread sleeps throughout
step = goodput.step
for i in range(n):
    with step(i):
        pass
os._exit(0)
