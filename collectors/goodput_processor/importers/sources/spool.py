"""Emitted goodput spans written as spool files (``goodput import --from ... --to RUN_DIR``):
:func:`write_spool`."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from goodput import schema

from ..common import OutputExistsError

try:  # optional speed-up, never a dependency (as in goodput_processor.read.reader)
    import orjson

    def _dumps(doc) -> str:
        return orjson.dumps(doc).decode()
except ImportError:  # pragma: no cover - depends on the environment
    def _dumps(doc) -> str:
        return json.dumps(doc, separators=(",", ":"))

__all__ = ["write_spool"]


def _res_value(rs: dict, key: str):
    for kv in rs["resource"]["attributes"]:
        if kv["key"] == key:
            v = kv["value"]
            return int(v["intValue"]) if "intValue" in v else v.get("stringValue")
    return None


def write_spool(resource_spans: list, run_dir, *, overwrite: bool = False) -> dict:
    """Write emitted ``ResourceSpans`` as spool files: ``RUN_DIR/<job dir>/spans-p<rank>-
    a<attempt>-<source>-<instance>.jsonl``, one file per process incarnation, one OTLP JSON
    request per line (a ``ResourceSpans`` with up to 512 spans), written as ``*.tmp`` and
    renamed once every file of the job is complete. The files of one source sit beside any
    other spool in the directory (the workers' own, another source's), so a launcher's log
    can be imported into its workers' job; ``overwrite`` replaces only that source's files.
    Returns ``{job: {"run_dir", "processes", "attempts", "spans", "files"}}``.

    Raises:
        OutputExistsError: a job directory already holds spans of the same source and
            ``overwrite`` is False (nothing written).
        OSError: the files cannot be written.
    """
    from ..writer import job_dir_name

    by_job: dict[str, dict[str, list]] = {}
    for rs in resource_spans:
        job = str(_res_value(rs, schema.RES_JOB_NAME))
        inst = str(_res_value(rs, schema.RES_SERVICE_INSTANCE_ID))
        by_job.setdefault(job, {}).setdefault(inst, []).append(rs)

    def tag_of(parts) -> str:
        src = str(_res_value(parts[0], schema.RES_IMPORTED_FROM) or "source")
        return "".join(c if c.isalnum() or c in "_." else "_" for c in src)[:40]

    root = Path(run_dir)
    for job, procs in by_job.items():
        d = root / job_dir_name(job)
        for tag in {tag_of(parts) for parts in procs.values()}:
            old = sorted(d.glob(f"spans-p*-a*-{tag}-*.jsonl*")) if d.is_dir() else []
            if old and not overwrite:
                raise OutputExistsError(f"{d} already holds spans imported from {tag} "
                                        f"({len(old)} files); pass --overwrite to replace "
                                        "them")
    out = {}
    for job, procs in by_job.items():
        d = root / job_dir_name(job)
        d.mkdir(parents=True, exist_ok=True)
        for tag in {tag_of(parts) for parts in procs.values()}:
            for p in d.glob(f"spans-p*-a*-{tag}-*.jsonl*"):
                p.unlink()
        written, nspans, attempts = [], 0, set()
        for inst, parts in sorted(procs.items()):
            rank = _res_value(parts[0], schema.RES_PROCESS_INDEX) or 0
            attempt = _res_value(parts[0], schema.RES_ATTEMPT) or 0
            attempts.add(attempt)
            h = hashlib.blake2b(inst.encode(), digest_size=4).hexdigest()
            final = d / f"spans-p{rank:05d}-a{attempt:04d}-{tag_of(parts)}-{h}.jsonl"
            tmp = final.with_name(final.name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                for rs in parts:
                    for ss in rs["scopeSpans"]:
                        nspans += len(ss["spans"])
                        f.write(_dumps({"resourceSpans": [
                            {"resource": rs["resource"], "scopeSpans": [ss]}]}) + "\n")
            written.append((tmp, final))
        for tmp, final in written:
            os.replace(tmp, final)
        out[job] = {"run_dir": str(d), "processes": len(procs), "attempts": len(attempts),
                    "spans": nspans, "files": len(written)}
    return out

