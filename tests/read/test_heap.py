"""The C heap's free pages given back (``goodput_processor.read.heap``), in a real process.

``goodput serve``'s maintenance round calls :func:`trim_heap_if_grown`: a poll's freed
temporaries must stop being resident, and memory the process really holds must not make
every round trim again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

COLLECTORS = str(Path(__file__).resolve().parents[2] / "collectors")

CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from goodput_processor.read.heap import resident_bytes, trim_heap, trim_heap_if_grown

    MiB = 2**20
    out = {}
    trim_heap()
    out["after_trim_again"] = trim_heap_if_grown(8 * MiB)  # nothing grew
    # a poll's temporaries: 48 MiB of 64 KiB blocks (under glibc's mmap threshold, so in
    # its heap), then one block after them, so the freed ones are not the heap's top
    temps = [b"x" * (64 << 10) for _ in range(768)]
    keep = b"y" * (64 << 10)
    before = resident_bytes()
    del temps
    out["freed_resident"] = resident_bytes() - before
    out["trimmed_freed"] = trim_heap_if_grown(8 * MiB)
    out["after_freed"] = resident_bytes() - before
    # memory the process holds: trimmed once (in vain), then the mark follows it
    held = [b"z" * (64 << 10) for _ in range(768)]
    out["trimmed_held"] = trim_heap_if_grown(8 * MiB)
    out["trimmed_held_again"] = trim_heap_if_grown(8 * MiB)
    out["held_resident"] = resident_bytes() - before
    print(json.dumps(out))
    """)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trim_when_grown_gives_back_freed_pages_and_follows_held_memory():
    run = subprocess.run([sys.executable, "-c", CHILD, COLLECTORS], capture_output=True,
                         text=True, timeout=60, check=True)
    out = json.loads(run.stdout)
    MiB = 2**20
    assert out["after_trim_again"] is False
    assert out["freed_resident"] > -8 * MiB  # glibc kept the freed blocks resident
    assert out["trimmed_freed"] is True
    assert out["after_freed"] < -40 * MiB  # ... and gave them back when asked
    assert out["trimmed_held"] is True  # grew by 48 MiB: one trim, which frees nothing
    assert out["trimmed_held_again"] is False  # the mark followed what is held
    assert out["held_resident"] > -8 * MiB
