"""The part of a reader that knows jobs and processes: which job, attempt and process a
resource names, and the reader's table of strings (within ``goodput serve``'s limits).

:class:`ResourceRows` is a mixin of :class:`goodput_processor.read.reader._Reader` (as
:class:`~goodput_processor.read.spans.SpanRows` is): it uses the reader's state made in
``_Reader.__init__`` (``jobs``, ``strings``, ``max_string``, ``max_custom_types``, ...).
:meth:`ResourceRows.resource_attrs` is shared by the OTLP JSON path and the protobuf path
of :mod:`goodput_processor.serve.decode`.
"""

from __future__ import annotations

import math

from goodput import schema

from . import rows as tl
from .attrs import _K_CUSTOM
from .rows import JobSpans, ProcessSpans
from .spans import _as_int, _dumps, job_name, json_resource_attrs

__all__ = ["ResourceRows"]

#: The schema major version this processor reads (``goodput.schema.version``).
_SUPPORTED_MAJOR = schema.SCHEMA_VERSION.split(".")[0]


class ResourceRows:
    """Jobs, processes and strings of a reader (a mixin of ``_Reader``)."""

    def _job(self, name: str) -> JobSpans:
        job = self.jobs.get(name)
        return job or self.jobs.setdefault(name, JobSpans(name, strings=self.strings))

    def _proc(self, job: JobSpans, attempt: int, index: int, instance: str = "") -> ProcessSpans:
        """The process of ``(attempt, index, instance)``. A resource with an ``instance``
        (``service.instance.id``: one OS process's attempt) seen before under another index
        is that process: a recorder that learned its rank from the framework writes its
        later spans with the real rank in the resource (since issue 36); its slot is read
        from its ``goodput.identity`` marker, its key stays the first index seen."""
        key = (attempt, index, instance)
        proc = job.processes.get(key)
        if proc is None:
            same = None
            if instance:
                of, n, same = self._instances.get(job.name, (None, -1, None))
                if of is not job or n != len(job.processes):  # added elsewhere: again
                    same = {(k[0], k[2]): p for k, p in job.processes.items() if k[2]}
                proc = same.get((attempt, instance))
                if proc is not None:
                    return proc
            proc = job.processes[key] = ProcessSpans(job.name, attempt, index, instance=instance)
            if same is not None:
                same[(attempt, instance)] = proc
                self._instances[job.name] = (job, len(job.processes), same)
        return proc

    def _sid(self, s: str) -> int:
        i = self._string_ids.get(s)
        if i is None:
            i = self._string_ids[s] = len(self.strings)
            self.strings.append(s)
        return i

    def type_sid(self, job: JobSpans, s: str, kind: int) -> int | None:
        """String id of a span's string attribute (a custom badput type, an end reason, an
        elastic or launcher event), within the reader's limits: a value longer than
        ``max_string`` is cut to it; a custom badput type (``kind`` is the custom badput
        kind) past ``max_custom_types`` distinct ones in the job gets None (the span is
        skipped as ``over_limit``). Both are counted in ``job.over_limit``. Other strings
        are never refused: an end marker or an elastic record is structure."""
        if self.max_string is not None and len(s) > self.max_string:
            s = s[: self.max_string]
            job.over_limit["attribute_bytes"] += 1
        i = self._sid(s)
        if (self.max_custom_types is not None and kind == _K_CUSTOM
                and i not in job.custom_sids):
            if len(job.custom_sids) >= self.max_custom_types:
                job.over_limit["custom_types"] += 1
                return None
            job.custom_sids.add(i)
        return i

    def _resource(self, rs: dict, exact: bool = False):
        """:meth:`resource_attrs` of an OTLP JSON ``ResourceSpans``. ``exact``: ``rs`` was
        parsed by orjson (:func:`~goodput_processor.read.spans._loads_exact`); then a
        resource written as the one before it (the same text: each line of a process
        repeats it) gives what it gave, without reading it again: reading it again would
        set the same values (goodput report has no limit to count, ``max_string`` None).

        Raises:
            AttributeError: ``rs`` or its resource is not a JSON object.
        """
        if not exact or self.max_string is not None or _dumps is None:
            return self.resource_attrs(json_resource_attrs(rs))
        last, got, last_rs = self._last_resource
        if rs is last_rs:  # the same object (a line parsed once, read again): never changed
            return got
        try:
            key = _dumps(rs.get("resource"))
        except TypeError:  # orjson.JSONEncodeError: not written back, read as it is
            key = None
        if key is not None and key == last:
            self._last_resource = (key, got, rs)
            return got
        got = self.resource_attrs(json_resource_attrs(rs))
        self._last_resource = (key, got, rs)
        return got

    def resource_attrs(self, attrs: dict):
        """Job and process of a resource given as ``{key: python value}``.

        Returns ``(job, proc, supported, schema_version)``; shared by the OTLP JSON path
        here and the protobuf path of :mod:`goodput_processor.serve.decode`.
        """
        self._last_resource = (None, None, None)  # what it sets may differ from the last line's
        name = job_name(attrs)
        try:
            attempt = _as_int(attrs.get(schema.RES_ATTEMPT, 0))
            index = _as_int(attrs.get(schema.RES_PROCESS_INDEX, 0))
        except (TypeError, ValueError, OverflowError):
            attempt, index = 0, 0
        # One OS process's attempt is one key; without the process start (recorders before
        # schema 1.1, imported logs) the declared (attempt, index) is, as it always was.
        instance = attrs.get(schema.RES_SERVICE_INSTANCE_ID)
        pstart = attrs.get(schema.RES_PROCESS_START)
        if instance is None or not isinstance(pstart, int) or isinstance(pstart, bool):
            instance = ""
        job = self._job(name)
        if self.max_string is not None:
            for key, v in attrs.items():
                if isinstance(v, str) and len(v) > self.max_string:
                    attrs[key] = v[: self.max_string]
                    job.over_limit["attribute_bytes"] += 1
        proc = self._proc(job, attempt, index, str(instance)[:64])
        host, count = attrs.get(schema.RES_HOST_NAME), attrs.get(schema.RES_PROCESS_COUNT)
        proc.host = proc.host if host is None else str(host)
        proc.process_count = count if isinstance(count, int) else proc.process_count
        pid = attrs.get(schema.RES_PROCESS_PID)
        if isinstance(pid, int) and not isinstance(pid, bool):
            proc.pid = pid
        if instance:
            proc.process_start_ns = pstart
        for key, attr in ((schema.RES_ATTEMPT_SOURCE, "attempt_source"),
                          (schema.RES_PROCESS_INDEX_SOURCE, "index_source")):
            if isinstance(attrs.get(key), str):
                setattr(proc, attr, attrs[key][:16])
        for key in tl.RUN_ATTRIBUTES + tl.LAUNCH_ATTRIBUTES:
            v = attrs.get(key)
            if v is not None and not (isinstance(v, float) and not math.isfinite(v)):
                proc.run[key] = v  # NaN/infinity dropped: the JSON report cannot hold them
        version = attrs.get(schema.RES_SCHEMA_VERSION)
        proc.schema_version = version = None if version is None else str(version)
        ok = version is None or version.split(".")[0] == _SUPPORTED_MAJOR
        if version is not None and ok:
            job.schema_versions.add(version)
        return job, proc, ok, version
