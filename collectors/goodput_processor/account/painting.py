"""One job's attempts painted into buckets: the running totals of an accounting.

Each attempt's primary-process phases, clipped to the attempt, cut the time line into
elementary segments; each segment is "painted" with the highest-priority level that covers
it (``docs/accounting.md``; difference arrays + cumsum per level, or one pass when no two
blocking phases overlap), step time per step is the step-level time inside it, and the
kept steps and their times are collected per attempt, or per piece of the running one
(:mod:`goodput_processor.model.pieces`). :mod:`.accounting` turns the totals into a
result. Integer nanoseconds throughout.
"""

from __future__ import annotations

import hashlib

import numpy as np

from goodput import schema

from ..model.attempts import Attempt
from ..model.memo import AccountingMemo, HashedKey, cached, proc_key, rows_key
from ..model.packed import PackedSegments
from ..model.pieces import running_pieces
from ..model.summaries import custom_sids, resume_step
from ..model.summaries import step_counts as _step_counts
from ..read.rows import (
    C_AUX,
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_SIDX,
    C_START,
    F_NONBLOCKING,
    K_ACCELERATOR_INIT,
    K_CHECKPOINT_RESTORE,
    K_CHECKPOINT_SAVE,
    K_CUSTOM_BADPUT,
    K_DATA_LOADING,
    K_ELASTIC_REINIT,
    K_ELASTIC_WAIT,
    K_PROGRAM_STARTUP,
    K_STEP,
    K_TRAINING_PREP,
    KIND_NAMES,
    NONE,
    JobSpans,
    clip_ns,
    is_phase,
)

#: Bucket of each phase kind (custom badput is per type).
_KIND_BUCKET = {
    K_ACCELERATOR_INIT: "accelerator_init",
    K_TRAINING_PREP: "training_prep",
    K_PROGRAM_STARTUP: "program_startup",
    K_DATA_LOADING: "data_loading",
    K_CHECKPOINT_SAVE: "checkpoint_save",
    K_CHECKPOINT_RESTORE: "checkpoint_restore",
    K_ELASTIC_REINIT: "elastic_reinitialization",
    K_STEP: "step",
}
#: Priority order (highest first); "custom" expands to the custom types alphabetically.
#: The elastic levels (schema 1.2) are always there; their buckets appear in a result only
#: for a job with elastic spans.
_PRIORITY = ("wasted_progress", "elastic_slice_down", "elastic_scale_up", "checkpoint_restore",
             "checkpoint_save", "custom", "elastic_reinitialization", "data_loading",
             "program_startup", "accelerator_init", "training_prep", "process_startup", "step")
#: Split of int64 ns for exact float sums: 2**26 (low parts sum exactly over 2**27 terms).
_SPLIT = 1 << 26


def _paint(a0: int, a1: int, starts, ends, levels, nlevels: int):
    """Boundaries ``b`` and the owner level of each segment ``[b[i], b[i+1])``.

    Unowned segments get level ``nlevels`` (= other).
    """
    # timsort ("stable"): the starts and the ends are each nearly sorted already
    b = np.sort(np.concatenate(([a0, a1], starts, ends)), kind="stable")
    b = b[np.concatenate(([True], b[1:] != b[:-1]))]
    m = len(b) - 1
    owner = np.full(m, nlevels, np.int16)
    if m <= 0:
        return b, owner
    si = np.searchsorted(b, starts)
    ei = np.searchsorted(b, ends)
    for lv in np.unique(levels):
        sel = levels == lv
        cnt = np.bincount(si[sel], minlength=m + 1) - np.bincount(ei[sel], minlength=m + 1)
        covered = np.cumsum(cnt[:m]) > 0
        owner[covered & (owner == nlevels)] = lv
    return b, owner


#: Take :func:`_disjoint_totals` when it applies (False: always paint; for tests).
DISJOINT_FAST_PATH = True


_LOW, _HIGH = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def _disjoint_totals(starts, ends, levels, cut: int, nlevels: int) -> np.ndarray | None:
    """Time (int64 ns) per level of the blocking phases ``[starts, ends)`` cut at ``cut``
    (the wasted region's start), when no two of them overlap; None when some do.

    The usual attempt (data loading, step, data loading, ...) has no overlap: then each
    phase owns all of its time below ``cut`` and painting (:func:`_paint`, a sort of every
    boundary) gives the same totals, at the cost of one nearly sorted pass. Memory: one
    int64 array of the phases' times and bool masks (when sorted and non-empty, as an
    attempt's phases come: empty ones are left out through masks instead).
    """
    if len(starts) > 1 and not (starts[1:] >= starts[:-1]).all():
        order = np.argsort(starts, kind="stable")
        starts, ends, levels = starts[order], ends[order], levels[order]
    k = int(np.searchsorted(starts, cut))  # those starting at or after the cut are empty
    starts, ends, levels = starts[:k], ends[:k], levels[:k]
    if k and not (ends > starts).all():  # empty phases in between: out through a mask
        ends = np.minimum(ends, cut)
        valid = ends > starts
        reach = np.where(valid, ends, _LOW)  # the latest end so far, empty ones out
        np.maximum.accumulate(reach, out=reach)
        if not ((starts[1:] >= reach[:-1]) | ~valid[1:]).all():
            return None
        del reach
        lengths = np.subtract(ends, starts, out=ends)
        np.maximum(lengths, 0, out=lengths)
    else:  # sorted, none empty: no overlap iff each ends by the next one's start (each of
        # these starts before the cut, so only the last can cross it)
        if k > 1 and not (ends[:-1] <= starts[1:]).all():
            return None
        lengths = ends - starts
        if k:
            lengths[-1] = min(int(ends[-1]), cut) - int(starts[-1])
    out = np.zeros(nlevels, np.int64)
    for lv in range(nlevels):  # a few levels: exact int64 sums (no int64 copy of levels)
        out[lv] = int(lengths.sum(where=levels == lv))
    return out


def _step_times(b, owner, step_level, ss, se):
    """Net time (int64 ns) charged to each step (steps sorted by start ``ss``/ends ``se``)."""
    n = len(ss)
    if n == 0:
        return np.zeros(0, np.int64)
    mask = owner == step_level
    seg_start = b[:-1][mask]
    seg_len = np.diff(b)[mask]
    j = np.searchsorted(ss, seg_start, side="right") - 1
    miss = se[j] <= seg_start
    if miss.any():  # overlapping steps: the covering step with the latest end
        cummax = np.maximum.accumulate(se)
        pam = np.maximum.accumulate(np.where(se == cummax, np.arange(n), 0))
        j[miss] = pam[j[miss]]
    return _int_bincount(j, seg_len, n)


def _int_bincount(idx: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """``np.bincount(idx, weights=values)`` for int64 ``values``, exact: summed as two
    halves whose float sums stay below 2**53 (a single float sum loses nanoseconds once
    spans reach 2**53 ns, about 104 days, e.g. a span starting at the epoch)."""
    hi, lo = np.divmod(values, _SPLIT)
    hs = np.rint(np.bincount(idx, weights=hi, minlength=n)).astype(np.int64)
    ls = np.rint(np.bincount(idx, weights=lo, minlength=n)).astype(np.int64)
    return hs * _SPLIT + ls


def _custom_types(job: JobSpans, attempts: list[Attempt], memo=None) -> list[str]:
    return sorted(set().union(*(attempt_types(job, a, memo) for a in attempts)))


def attempt_types(job: JobSpans, a: Attempt, memo=None) -> set[str]:
    """The custom badput types of attempt ``a``'s primary process."""
    return {_type_name(job, s) for s in cached(memo, ("custom", proc_key(a.primary)),
                                               lambda p=a.primary: custom_sids(p, memo))}


def _type_name(job: JobSpans, sidx) -> str:
    return job.strings[sidx] if sidx >= 0 else "unspecified"


def _row_bucket(job: JobSpans, kind: int, sidx: int) -> str:
    """Bucket name of one phase row: per type for custom badput and elastic waits."""
    if kind == K_CUSTOM_BADPUT:
        return schema.custom_bucket(_type_name(job, sidx))
    if kind == K_ELASTIC_WAIT:
        return schema.elastic_wait_bucket(job.strings[sidx] if sidx >= 0 else None)
    return _KIND_BUCKET[kind]


def _elastic_lost(d: np.ndarray, snum: np.ndarray, ss: np.ndarray) -> np.ndarray:
    """Steps (numbers ``snum``, starts ``ss``) of one process's attempt that an elastic event
    inside the attempt threw away: for each blocking ``goodput.elastic_wait`` span, the
    training resumed after it from :func:`resume_step` of the rows that start after it; a
    step that started before the wait with a higher number was lost (``docs/accounting.md``,
    "Elastic training")."""
    lost = np.zeros(len(ss), bool)
    waits = (d[:, C_KIND] == K_ELASTIC_WAIT) & ((d[:, C_FLAGS] & F_NONBLOCKING) == 0)
    for w in np.unique(d[waits, C_START]):
        bound = resume_step(d[d[:, C_START] >= w])
        if bound is not None:
            lost |= (ss < w) & (snum != NONE) & (snum > bound)
    return lost


class _Acc:
    """Running totals of one job's accounting, per priority level (ns)."""

    def __init__(self, job: JobSpans, attempts: list[Attempt], keep_segments: bool = False,
                 memo: AccountingMemo | None = None, types: list[str] | None = None):
        self.job = job
        self.memo = memo
        # For windows: per attempt or piece of one (see attempt()), (attempt index,
        # boundaries, owner level, kept-step index of step-level segments within the part
        # (-1: not kept / not a step segment), index of the part's first kept step);
        # None = not kept.
        self.segments: list[tuple] | None = [] if keep_segments else None
        self._kept_before = 0
        self.names: list[str] = []
        for name in _PRIORITY:
            if name == "custom":
                self.names += [schema.custom_bucket(t) for t in (
                    _custom_types(job, attempts, memo) if types is None else types)]
            else:
                self.names.append(name)
        self.level = {n: i for i, n in enumerate(self.names)}
        self.kind_level = np.full(len(KIND_NAMES), self.level["step"], np.int16)  # by kind
        for k, name in _KIND_BUCKET.items():
            self.kind_level[k] = self.level[name]
        self.other = len(self.names)  # level of unowned segments
        self._ns = np.zeros(self.other + 1, np.int64)  # (summed part by part: ns)
        self.async_ns: dict[str, int] = {}
        #: whether any attempt has elastic spans (their buckets go into the result)
        self.elastic = False
        self.kept: list[tuple] = []  # per attempt: step numbers, attempt, starts, times
        #: per attempt: where its wasted region starts (ns; its end when it has none)
        self.wasted_start: list[int] = []
        #: per part (an attempt, or a piece of the running one): its memo key
        self.part_keys: list = []
        self.parts: list = []  # per part: what it added (see _part)
        self.attempt_index = 0  # attempts added so far

    @property
    def ns(self) -> list[int]:
        """Time per priority level so far (ns, Python ints; the last: unowned)."""
        return self._ns.tolist()

    def attempt(self, a: Attempt, bound: int | None, has_next: bool) -> tuple[int, int]:
        """Account attempt ``a``; ``bound``: highest kept step (None = all). -> (kept, wasted).

        With a memo, the attempt's part is taken from it when its inputs are unchanged: the
        primary's rows, the attempt's bounds and number, ``bound``, ``has_next``, the
        levels, whether an earlier attempt was elastic and whether segments are kept. The
        running (last) attempt is accounted in pieces (:mod:`goodput_processor.model.pieces`):
        those that new rows cannot change come from the memo, only the last is redone.
        """
        names, seg = tuple(self.names), self.segments is not None
        cuts = None
        if self.memo is not None and bound is None and not has_next and not self.elastic:
            cuts = running_pieces(self.memo, a)
        if not cuts:  # (the rows read only when the part is not kept: they may be packed)
            key = HashedKey(("attempt", a.attempt, a.start_ns, a.end_ns, proc_key(a.primary),
                             bound, has_next, names, self.elastic, seg))
            return self._add(cached(self.memo, key, lambda: self._part(
                a.primary.data, a.start_ns, a.end_ns, a.attempt, bound, has_next)), key, a1=None)
        starts = [0] + [n for n, _ in cuts[:-1]]
        ids = cached(self.memo, ("piece_rows", a.attempt, proc_key(a.primary), tuple(cuts)),
                     lambda: [rows_key(a.primary.data[n0:n1])
                              for n0, (n1, _) in zip(starts, cuts, strict=True)])
        kept = wasted = 0
        n0, c0 = 0, a.start_ns
        for (n1, c1), rid in zip(cuts, ids, strict=True):  # the pieces new rows cannot change
            key = ("piece", a.attempt, a.start_ns, c0, c1, n0, rid, names, seg)
            k, w = self._add(cached(self.memo, key, lambda n0=n0, n1=n1, c0=c0, c1=c1: self._part(
                a.primary.data[n0:n1], c0, c1, a.attempt, None, False, lead=n0 == 0)), key,
                a1=False)
            kept, wasted = kept + k, wasted + w
            n0, c0 = n1, c1
        key = ("tail", a.attempt, c0, a.end_ns, n0, proc_key(a.primary), names, seg)
        part = cached(self.memo, key, lambda: self._part(
            a.primary.data[n0:], c0, a.end_ns, a.attempt, None, False, lead=False))
        # Its kept steps are named by what they are, not by the attempt's end (now, while
        # it runs): a poll with nothing new, only a later now, finds what was made of them.
        # (Not by the rows alone: the end clips the phases, and an attempt that stops
        # running can end before a row of its primary that gave an earlier end marker.)
        k, w = self._add(part, ("tail_steps", a.attempt, c0, n0, proc_key(a.primary),
                                steps_digest(part[3])), a1=a.end_ns)
        return kept + k, wasted + w

    def _add(self, part: tuple, key, a1) -> tuple[int, int]:
        """Add one attempt's part (or one piece of it) to the totals; ``a1``: None for a
        whole attempt, False for a piece before the last, the attempt's end for the last
        piece (only a whole attempt or its last piece ends it: its wasted-region start)."""
        self.part_keys.append(key)
        self.parts.append(part)
        ns, async_ns, elastic, kept, ws, counts, segments = part
        self._ns += ns
        for k, v in async_ns.items():
            self.async_ns[k] = self.async_ns.get(k, 0) + v
        self.elastic |= elastic
        if a1 is not False:
            self.wasted_start.append(ws if a1 is None else a1)
            self.attempt_index += 1
        if self.segments is not None:  # (kept-step ranks within the part, and its offset)
            # (packed segments, serve.compaction.pack_segments: b a PackedSegments)
            b, owner, seg_kept = ((segments, None, None) if isinstance(segments, PackedSegments)
                                  else segments)
            self.segments.append((self.attempt_index - (a1 is not False), b, owner, seg_kept,
                                  self._kept_before))
        self._kept_before += len(kept[0])
        self.kept.append(kept)
        return counts

    def attempt_segments(self) -> list[tuple]:
        """Per attempt, ``(boundaries, owner level, kept-step rank)`` of its painted
        segments, its pieces joined (see :meth:`attempt`)."""
        out: list[list] = []
        for i, b, owner, seg_kept, off in self.segments:
            if isinstance(b, PackedSegments):
                b, owner, seg_kept = b.arrays()
            if off:
                seg_kept = np.where(seg_kept >= 0, seg_kept + off, -1)
            if len(out) <= i:
                out.append([b, owner, seg_kept])
            else:
                prev = out[i]
                out[i] = [np.concatenate((prev[0], b[1:])), np.concatenate((prev[1], owner)),
                          np.concatenate((prev[2], seg_kept))]
        return [tuple(x) for x in out]

    def _part(self, d: np.ndarray, a0: int, a1: int, attempt: int, bound: int | None,
              has_next: bool, lead: bool = True) -> tuple:
        """What the rows ``d`` of attempt number ``attempt`` add over ``[a0, a1)`` (see
        :meth:`attempt`): ``(ns per level (int64 array), asynchronous ns by bucket, has
        elastic spans, kept-step arrays, wasted-region start, (kept, wasted) step counts,
        segments or None)``; ``lead``: ``a0`` is the attempt's start (the time to its first
        phase is process startup). Reads ``self`` only for the levels and ``self.elastic``
        (an earlier attempt was elastic)."""
        job, level = self.job, self.level
        level_ns = np.zeros(self.other + 1, np.int64)
        async_ns: dict[str, int] = {}
        kinds = d[:, C_KIND]
        phase = is_phase(kinds)
        blocking = (d[:, C_FLAGS] & F_NONBLOCKING) == 0
        for r in np.flatnonzero(phase & ~blocking):  # asynchronous work: reported, not badput
            key = _row_bucket(job, int(kinds[r]), int(d[r, C_SIDX]))
            s_r, e_r = min(max(int(d[r, C_START]), a0), a1), min(max(int(d[r, C_END]), a0), a1)
            async_ns[key] = async_ns.get(key, 0) + e_r - s_r
        elastic = bool(((kinds == K_ELASTIC_WAIT) | (kinds == K_ELASTIC_REINIT)).any())
        # (clipping is monotone: the earliest clipped start is the earliest start clipped)
        first_phase = min(max(int(np.min(d[:, C_START], where=phase, initial=_HIGH)), a0), a1
                          ) if phase.any() else None
        save_ends = clip_ns(d[(kinds == K_CHECKPOINT_SAVE) & blocking & (d[:, C_IVAL] == bound),
                              C_END], a0, a1) if has_next and bound is not None else None
        # The blocking phases with time in [a0, a1), clipped to it: one column at a time
        # (the rows' columns are most of an attempt's memory; no clipped copy of them)
        use = phase & blocking
        del phase, blocking
        ps, pe = d[use, C_START], d[use, C_END]
        clip_ns(ps, a0, a1, out=ps)
        clip_ns(pe, a0, a1, out=pe)
        some = pe > ps
        if not some.all():
            use[use] = some
            ps, pe = ps[some], pe[some]
        del some
        pk = kinds[use]
        lv = self.kind_level[pk]
        for typed in (K_CUSTOM_BADPUT, K_ELASTIC_WAIT):  # levels per type
            cidx = np.flatnonzero(pk == typed)
            if len(cidx):
                sids = d[:, C_SIDX][use][cidx]
                for sx in np.unique(sids):
                    lv[cidx[sids == sx]] = level[_row_bucket(job, typed, int(sx))]
        is_step = pk == K_STEP
        del pk
        steps = use  # the rows of the steps among them (in row order)
        steps[use] = is_step
        del use
        # The kept steps, in row order for now (what follows up to the step times reads
        # them in any order): sorted by start only once the phases' arrays are spent
        snum = d[steps, C_IVAL]
        kept = np.ones(len(snum), bool) if bound is None else snum <= bound
        if self.elastic or elastic:  # steps an elastic event inside this attempt threw away
            kept &= ~_elastic_lost(d, snum, ps[is_step])
        # The wasted region: from the end of the last kept step (or of the blocking save of
        # checkpoint `bound`, if later; or the first step if none is kept) to the end.
        ws = None
        if has_next and len(snum):
            ws = int(pe[is_step][kept].max()) if kept.any() else int(ps[is_step].min())
            if kept.any() and bound is not None and len(save_ends):
                ws = max(ws, int(save_ends.max()))
        wasted_start = a1 if ws is None else min(ws, a1)
        # Process startup: from the attempt's start to the primary's first phase (any).
        first = (a1 if first_phase is None else first_phase) if lead else a0
        cut = ws if ws is not None and ws < a1 else a1  # where the wasted region starts
        totals = None
        if self.segments is None and DISJOINT_FAST_PATH:
            totals = _disjoint_totals(ps, pe, lv, cut, self.other + 1)
        if totals is not None:  # no two blocking phases overlap: no painting needed
            totals[level["wasted_progress"]] += a1 - cut
            # (the wasted region outranks process startup where they meet)
            totals[level["process_startup"]] += max(0, min(first, cut) - a0)
            totals[self.other] += (a1 - a0) - int(totals.sum())
            level_ns += totals
        else:
            bs, be, bl = ps, pe, lv
            if cut < a1:
                bs, be = np.append(bs, cut), np.append(be, a1)
                bl = np.append(bl, np.int16(level["wasted_progress"]))
            if first > a0:
                bs, be = np.append(bs, a0), np.append(be, first)
                bl = np.append(bl, np.int16(level["process_startup"]))
            b, owner = _paint(a0, a1, bs, be, bl, self.other)
            del bs, be, bl
            seg_len = np.diff(b)
            for lev in range(self.other + 1):
                level_ns[lev] += int(seg_len[owner == lev].sum())
        del lv
        starts = ps[is_step]
        if len(starts) < 2 or bool((starts[1:] > starts[:-1]).all()):
            order = None  # already in time order (as a process records them): no copies
            ss, se = starts, pe[is_step]
        else:
            order = np.argsort(starts, kind="stable")
            if not np.diff(starts[order]).all():
                # steps starting together: order them by end, number and count, not arrival
                order = np.lexsort((d[steps, C_AUX], snum, pe[is_step], starts))
            ss = starts[order]
            se = pe[is_step][order]
            snum, kept = snum[order], kept[order]
        del starts, ps, pe
        aux = d[steps, C_AUX]
        ones = bool(((aux == NONE) | (aux <= 1)).all())  # every step span is one step
        scount = np.broadcast_to(np.int64(1), (len(ss),)) if ones else _step_counts(
            aux if order is None else aux[order])
        del aux, order, steps, is_step
        if totals is not None:
            net = np.maximum(np.minimum(se, cut) - ss, 0)
        else:
            net = _step_times(b, owner, level["step"], ss, se)
        # Step time of steps that are not kept but lie outside the wasted region (e.g.
        # step numbers out of order) is thrown-away work too.
        lost = int(net[~kept].sum())
        level_ns[level["wasted_progress"]] += lost
        level_ns[level["step"]] -= lost
        segments = None
        if self.segments is not None:
            segments = _kept_segments(b, owner, level["step"], ss, se, kept)
        nkept = int(kept.sum())
        counts = (nkept, len(ss) - nkept) if ones else (int(scount[kept].sum()),
                                                       int(scount[~kept].sum()))
        if nkept < len(ss):  # (all kept: the arrays themselves, no copy)
            snum, ss, net = snum[kept], ss[kept], net[kept]
            scount = scount[:nkept] if ones else scount[kept]
        # (the attempt and, for recorded steps, the count are one number for the whole
        # column: read-only broadcast views, no memory per step)
        kept_arrays = (snum, np.broadcast_to(np.int64(attempt), (nkept,)), ss, net, scount)
        return (level_ns, async_ns, elastic, kept_arrays, wasted_start, counts, segments)


def steps_digest(kept: tuple) -> bytes:
    """A 16-byte BLAKE2b digest of a part's kept-step arrays (:meth:`_Acc._part`: step
    numbers, attempt, starts, times, counts; int64), naming them in memo keys."""
    h = hashlib.blake2b(digest_size=16)
    for x in kept:
        h.update(len(x).to_bytes(8, "little"))
        h.update(np.ascontiguousarray(x, np.int64).tobytes())
    return h.digest()


def _kept_segments(b, owner, step_level, ss, se, kept) -> tuple:
    """One attempt's painted segments, for :func:`account_windows`: ``(boundaries,
    owner level, rank of the kept step of each step-level segment among the attempt's
    kept steps (-1: none))``."""
    seg_kept = np.full(len(owner), -1, np.int64)
    if len(ss):
        mask = owner == step_level
        seg_start = b[:-1][mask]
        j = np.searchsorted(ss, seg_start, side="right") - 1
        miss = se[j] <= seg_start
        if miss.any():  # as in _step_times: the covering step with the latest end
            cummax = np.maximum.accumulate(se)
            pam = np.maximum.accumulate(np.where(se == cummax, np.arange(len(ss)), 0))
            j[miss] = pam[j[miss]]
        rank = np.cumsum(kept) - 1
        seg_kept[mask] = np.where(kept[j], rank[j], -1)
    return b, owner, seg_kept
