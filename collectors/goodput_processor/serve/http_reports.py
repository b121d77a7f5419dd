"""``GET`` endpoints of the OTLP/HTTP receiver (:mod:`goodput_processor.serve.http`, whose
docstring lists them): the JSON report, one page of jobs at a time (``/v1/report``), the
HTML report (``/v1/report.html``), ``/metrics``, ``/healthz`` and ``/readyz``."""

from __future__ import annotations

import bisect
import logging
from urllib.parse import parse_qs, urlsplit

from .receiver import Rejected
from .store import LiveStore

__all__ = ["ReportEndpoints"]

_log = logging.getLogger("goodput_processor.serve.receiver")
#: ``/v1/report`` page size: default and largest.
_PAGE, _MAX_PAGE = 100, 1000


class ReportEndpoints:
    """The ``GET`` side of the receiver's request handler (a base class of it: it uses the
    handler's ``path``, ``server.app``, ``_reply``, ``_error``, ``_reject`` and
    ``_check_token``)."""

    def do_GET(self):  # noqa: N802
        url = urlsplit(self.path)
        app = self.server.app
        kind = "text" if url.path == "/metrics" else "json"
        try:
            if url.path == "/healthz":
                return self._reply(200, b"ok\n", "text/plain")
            if url.path == "/readyz":
                ready = getattr(app.store, "ready", None)
                ok, why = ready() if ready is not None else (True, "ready")
                if ok:
                    return self._reply(200, b"ready\n", "text/plain")
                return self._reply(503, f"{why}\n".encode(), "text/plain; charset=utf-8",
                                   {"Retry-After": "1"})
            if url.path == "/metrics":
                return self._metrics()
            if url.path not in ("/v1/report", "/v1/report.html"):
                return self._error(404, 5, "text", f"no such path {url.path!r} (GET /v1/report, "
                                   "/v1/report.html, /metrics, /healthz, /readyz)")
            self._check_token()
            if url.path.endswith(".html"):  # the HTML report of docs/html-report.md
                return self._report_html(parse_qs(url.query).get("job", [None])[0])
            return self._report(parse_qs(url.query))
        except Rejected as r:
            return self._reject(r, kind)
        except OSError:
            raise  # the client went away: the server logs it (debug) and closes
        except Exception:
            _log.exception("goodput serve http: GET %s failed", url.path)
            return self._reject(Rejected("internal", 500, 13, "internal error (logged)",
                                         close=True), "text")

    def _metrics(self) -> None:
        app = self.server.app
        if app.metrics is None:
            return self._error(404, 5, "text", "no metrics on this server")
        self._check_token()
        out = app.metrics()
        if out is None:
            return self._error(404, 5, "text", "no metrics on this server")
        body, ctype = out
        self._reply(200, body, ctype)

    def _report(self, query: dict) -> None:
        """One page of the JSON report (see the module docstring)."""
        from ..results.report_json import dumps, to_json_dict

        store = self.server.app.store
        job = query.get("job", [None])[0]
        if job is not None:
            try:
                results, token = store.results(job=job), None
            except KeyError as e:
                final = getattr(store, "final_report", lambda _job: None)(job)
                if final is None:
                    return self._error(404, 5, "json", e.args[0])
                doc = {**to_json_dict([]), "jobs": [final], "final": True}  # (retired: .slots)
                return self._reply(200, dumps(doc).encode(), "application/json")
        else:
            text = query.get("limit", [str(_PAGE)])[0]
            if not (text.isdigit() and int(text) > 0):
                raise Rejected("malformed", 400, 3, f"limit must be an integer > 0, got {text!r}")
            limit = min(int(text), _MAX_PAGE)
            names = store.jobs()
            after = query.get("page_token", [""])[0]
            first = bisect.bisect_right(names, after) if after else 0
            page = names[first:first + limit]
            token = page[-1] if first + limit < len(names) else None
            results = _results_for(store, page)
        doc = to_json_dict(results)
        doc["next_page_token"] = token
        summary = getattr(store, "sources_summary", None)
        if summary is not None and (found := summary()):
            doc["sources"] = found
        self._reply(200, dumps(doc).encode(), "application/json")

    def _report_html(self, job: str | None) -> None:
        try:
            from ..html import live_report_html

            body = live_report_html(self.server.app.store, job=job).encode()
        except KeyError as e:
            return self._error(404, 5, "json", e.args[0])
        self._reply(200, body, "text/html; charset=utf-8")


def _results_for(store: LiveStore, names: list[str]) -> list:
    """Results of the jobs ``names`` (those that left meanwhile are left out)."""
    many = getattr(store, "results_for", None)
    if many is not None:
        return many(names)
    out = []
    for name in names:
        try:
            out.extend(store.results(job=name))
        except KeyError:
            pass
    return out

