"""All the exporters of one recorder, each fed by its own :class:`goodput.forward.Forwarder`.

:class:`Forwarding` makes one forwarder per exporter (keyed by
:func:`goodput.export.exporter_key`, made unique), tells them of the spool's new and closed
journal files, holds spans in their memory queues when there is no spool or a spool write
failed, and counts what no exporter could take. The recorder's background thread is its
only caller; see :mod:`goodput.forward` for how a forwarder reads, sends and retries.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from goodput.forward import Forwarder

_log = logging.getLogger(__name__)


class Forwarding:
    """The forwarders of one recorder (one per exporter).

    Args:
        exporters: ``SpanExporter`` objects; their keys come from
            :func:`goodput.export.exporter_key`.
        run_dir: spool directory, None when the spool is off.
        process_index: this process's rank.
        poll_s: see :class:`Forwarder`.
    """

    def __init__(self, exporters, run_dir, process_index: int, poll_s: float = 1.0):
        from goodput.export import exporter_key

        keys: dict[str, int] = {}
        self.forwarders = []
        for e in exporters:
            key = exporter_key(e)
            keys[key] = keys.get(key, 0) + 1
            if keys[key] > 1:
                key = f"{key}-{keys[key]}"
            self.forwarders.append(Forwarder(e, key, run_dir, process_index, poll_s=poll_s))
        self.run_dir = run_dir
        self.lost = 0  # spans no exporter could take (spool failed, no exporter)
        self._warned = False

    @property
    def dropped(self) -> int:
        """Spans really lost: ``lost`` plus the forwarders' dropped (memory queue full)."""
        return self.lost + sum(f.dropped for f in self.forwarders)

    def attach(self, path: str) -> None:
        for f in self.forwarders:
            f.attach(path)

    def detach(self) -> None:
        for f in self.forwarders:
            f.detach()

    def notify(self) -> None:
        for f in self.forwarders:
            f.notify()

    def sent(self, path: str) -> bool:
        """Whether every exporter has sent all of the closed spool file ``path``."""
        return all(f.sent_all(path) for f in self.forwarders)

    def forget(self, path: str) -> None:
        """``path`` was deleted (a compacted segment's journal): drop its offset sidecars."""
        for f in self.forwarders:
            with f._lock:
                f._files.pop(os.fspath(path), None)
            try:
                os.remove(f"{path}.{f.key}.offset")
            except OSError:
                pass

    def hold(self, spans) -> None:
        """Spans in memory for every exporter (no spool)."""
        for f in self.forwarders:
            f.enqueue(spans)

    def spool_failed(self, spans) -> None:
        """``spans`` could not be written to the spool: keep them in memory, or count them."""
        if not self._warned:
            self._warned = True
            if self.forwarders:
                _log.warning("goodput: spool %s not writable: spans go to the exporters from "
                             "memory (at most %d each); training continues", self.run_dir,
                             self.forwarders[0].max_queue_spans)
            else:
                _log.warning("goodput: spool %s not writable and no other exporter: spans "
                             "are lost and counted (goodput.recorder.dropped); training "
                             "continues", self.run_dir)
        if self.forwarders:
            self.hold(spans)
        else:
            self.lost += len(spans)

    def wait(self, timeout_s: float) -> bool:
        """Wait until every exporter has everything written so far (bounded); True if so."""
        deadline = time.monotonic() + timeout_s
        ok = True
        for f in self.forwarders:
            ok = f.wait(deadline - time.monotonic()) and ok
        return ok

    def stats(self) -> dict:
        return {f.key: {"sent": f.sent, "failures": f.failures, "dropped": f.dropped,
                        "bad_lines": f.bad_lines, "pending_bytes": f.pending_bytes()}
                for f in self.forwarders}

    def shutdown(self, timeout_s: float) -> None:
        """Drain every forwarder (in parallel, bounded by ``timeout_s`` in all)."""
        threads = [threading.Thread(target=f.shutdown, args=(timeout_s,), daemon=True)
                   for f in self.forwarders]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s + 2.0)
