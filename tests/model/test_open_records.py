"""Open records resolved a batch at a time equal them resolved over all the rows (Hypothesis).

One process's rows (phases of a few kinds, some of them ``goodput.open`` records of phases
in flight, repeated at later flushes, completed later or never, overlapping phases of one
kind, late rows) arrive in random batches. After every batch the
:class:`~goodput_processor.model.open_records.OpenResolver` kept from the batches before must give
the same array, byte for byte, as :func:`~goodput_processor.model.open_records.resolve_open` of all
the rows so far, and say how many rows come before the open records it kept; and so must
``resolve_open`` written over the rows themselves (``in_place``, ``goodput report``).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goodput_processor.model import open_records
from goodput_processor.model.open_records import OpenResolver, resolve_open
from goodput_processor.read.rows import (
    C_FLAGS,
    F_ENDLESS,
    F_OPEN,
    K_CHECKPOINT_SAVE,
    K_DATA_LOADING,
    K_STEP,
    NCOLS,
    NONE,
)

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
KINDS = (K_STEP, K_DATA_LOADING, K_CHECKPOINT_SAVE)


@st.composite
def process_rows(draw):
    """Rows of one process in arrival order, and the batch sizes they arrive in."""
    rows, sid, t = [], 0, 1_000
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(KINDS))
        start = t + draw(st.integers(-3, 3)) * 10  # (overlaps and late starts too)
        length = draw(st.integers(0, 4)) * 10
        t = max(t, start + length) + draw(st.integers(0, 2)) * 10
        for k in range(draw(st.integers(0, 3))):  # open records at flushes in flight
            sid += 1
            rows.append([start, start + 5 * k, kind, NONE, NONE, F_OPEN, -1, 0, sid])
        if draw(st.booleans()) or not rows:  # the phase's complete span, or it never ends
            sid += 1
            rows.append([start, start + length, kind, 7, NONE, 0, -1, 0, sid])
    order = draw(st.permutations(range(len(rows)))) if draw(st.booleans()) else None
    data = np.array(rows, np.int64).reshape(-1, NCOLS)
    if order is not None:
        data = data[list(order)]
    sizes = draw(st.lists(st.integers(1, 6), max_size=10))
    return data, sizes


@SETTINGS
@given(case=process_rows())
def test_resolved_a_batch_at_a_time_equals_resolved_at_once(case):
    data, sizes = case
    res, n = OpenResolver(), 0
    for size in [*sizes, len(data)]:
        n = min(len(data), n + size)
        if not n:
            continue
        got, settled = res.resolve(data[:n])
        want = resolve_open(data[:n])
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        assert settled == int(((data[:n, C_FLAGS] & F_OPEN) == 0).sum())
        assert not (got[settled:, C_FLAGS] & F_OPEN).any()
        assert ((got[settled:, C_FLAGS] & F_ENDLESS) != 0).all()
        own = data[:n].copy()  # resolved over the rows themselves, a few rows at a time
        chunk, open_records._CHUNK_ROWS = open_records._CHUNK_ROWS, 2
        try:
            in_place = resolve_open(own, in_place=True)
        finally:
            open_records._CHUNK_ROWS = chunk
        assert in_place.tobytes() == want.tobytes()
        assert in_place.base is own or in_place is own or not (
            (own[:, C_FLAGS] & F_OPEN).any())


def test_rows_that_do_not_continue_the_ones_taken_are_taken_again():
    """A poll whose rows are not the earlier ones plus new ones (another process's, or
    rows changed in place): resolved afresh, not from what was kept."""
    a = np.array([[100, 200, K_STEP, 1, NONE, 0, -1, 0, 1],
                  [200, 250, K_STEP, NONE, NONE, F_OPEN, -1, 0, 2]], np.int64)
    b = a.copy()
    b[0, 1] = 150
    res = OpenResolver()
    assert res.resolve(a)[0].tobytes() == resolve_open(a).tobytes()
    got, settled = res.resolve(b)
    assert got.tobytes() == resolve_open(b).tobytes() and settled == 1
    assert got[1, 1] == 250 and got[1, C_FLAGS] == F_ENDLESS
