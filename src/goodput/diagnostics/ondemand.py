"""On-demand profile capture of a running training process.

Two triggers, both enabled by :func:`enable` (or ``diagnostics.run(on_demand_profile=True)``):

- a signal: ``kill -USR2 <pid>`` captures ``GOODPUT_PROFILE_DURATION_S`` seconds (default 10);
- a local HTTP endpoint on 127.0.0.1 (port ``enable(port=)``, else ``GOODPUT_PROFILE_PORT``,
  else 9012; 0 picks a free one)::

      curl -X POST 'http://127.0.0.1:9012/profile?duration_s=5'   # 202 {"session_id": ...}
      curl http://127.0.0.1:9012/profile                           # status JSON

  ``POST /profile`` takes ``duration_s`` (0 < d <= 600 by default, else 400) and an optional
  ``session_id`` (give every host the same one to group them); 409 while a capture is
  pending or running (also a programmatic one).

Every trigger runs on the MAIN thread: the PyTorch profiler records only the thread that
started it, and stopping it from another thread crashes the process. The HTTP handler
stores the request and sends the signal to its own process; the signal handler (Python
runs it on the main thread, between two bytecodes of the training loop) starts the
capture, and a timer thread sends the signal again when the duration is over, so that the
handler stops it. A training loop blocked in one long call (a huge jitted step) delays
both; the span covers the real capture time. The JAX profiler is process-wide, so when no
signal handler can be installed (``enable()`` called off the main thread, ``signum=None``)
JAX captures run on a helper thread instead; PyTorch ones are then refused (503).

Captures are the same as :func:`goodput.diagnostics.profile.profile`'s (files under
``<dir>/<session_id>/``, a ``custom:profile`` span) with ``goodput.profile.trigger =
"on_demand"`` and session ids ``<prefix>-ondemand-<n>``.
"""

from __future__ import annotations

import atexit
import http.server
import json
import logging
import math
import os
import signal
import threading
import time
import urllib.parse

from goodput.diagnostics import profile as _profile

_log = logging.getLogger(__name__)

DEFAULT_PORT = 9012
DEFAULT_DURATION_S = 10.0
MAX_DURATION_S = 600.0
ENV_PORT = "GOODPUT_PROFILE_PORT"
ENV_DURATION = "GOODPUT_PROFILE_DURATION_S"

_HANDLE: OnDemand | None = None
_HANDLE_LOCK = threading.Lock()


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
        if not math.isfinite(value) or value <= 0:
            raise ValueError
        return value
    except ValueError:
        _log.warning("goodput profile: %s=%r is not a positive number: using %s",
                     name, raw, default)
        return default


def _env_port(default: int) -> int:
    raw = os.environ.get(ENV_PORT)
    if raw in (None, ""):
        return default
    try:
        port = int(raw)
        if not 0 <= port <= 65535:
            raise ValueError
        return port
    except ValueError:
        _log.warning("goodput profile: %s=%r is not a port: using %s", ENV_PORT, raw, default)
        return default


class _Request:
    __slots__ = ("session_id", "duration_s", "requested_at")

    def __init__(self, session_id: str, duration_s: float):
        self.session_id = session_id
        self.duration_s = duration_s
        self.requested_at = time.time()


class OnDemand:
    """The on-demand trigger of this process (made by :func:`enable`).

    Attributes: ``port`` (the HTTP port, None without HTTP), ``pid``, ``signum`` (None
    without the signal trigger), ``dir`` (None: the default profile directory).
    """

    def __init__(self, run=None, *, port=None, host="127.0.0.1", signum=signal.SIGUSR2,
                 dir=None, duration_s=None, framework="auto", max_duration_s=MAX_DURATION_S):
        self.run = run
        self.dir = dir
        self.framework = framework
        self.max_duration_s = float(max_duration_s)
        self.default_duration_s = (float(duration_s) if duration_s is not None
                                   else None)  # None: GOODPUT_PROFILE_DURATION_S at trigger time
        self.pid = os.getpid()
        self.signum = None
        self.port = None
        self._lock = threading.Lock()
        self._pending: _Request | None = None
        self._current: _Request | None = None
        self._cap = None
        self._started_at = None
        self._deadline = 0.0
        self._stop_due = False
        self._timers: list[threading.Timer] = []
        self._last: dict | None = None
        self._counts = {"captures": 0, "errors": 0}
        self._closed = False
        self._prev_handler = None
        self._server = None
        self._thread = None
        if signum is not None:
            self._install_signal(signum)
        if port is None:
            port = _env_port(DEFAULT_PORT)
        if port is not None and port >= 0:
            self._start_http(host, port)
        atexit.register(self.stop)

    # --- triggers -------------------------------------------------------------

    def _install_signal(self, signum) -> None:
        if threading.current_thread() is not threading.main_thread():
            _log.warning("goodput profile: enable() off the main thread: no signal trigger "
                         "(JAX captures run on a helper thread, PyTorch ones are refused)")
            return
        try:
            prev = signal.getsignal(signum)
            if prev not in (signal.SIG_DFL, signal.SIG_IGN, None):
                _log.warning("goodput profile: replacing the handler of %s for on-demand "
                             "capture (restored by disable())", signal.Signals(signum).name)
            signal.signal(signum, self._on_signal)
        except (ValueError, OSError) as exc:
            _log.warning("goodput profile: cannot handle signal %s: %s", signum, exc)
            return
        self._prev_handler = prev
        self.signum = signum

    def _start_http(self, host: str, port: int) -> None:
        handler = type("_Handler", (_Handler,), {"ondemand": self})
        try:
            server = _Server((host, port), handler)
        except OSError as exc:
            _log.warning("goodput profile: cannot listen on %s:%s (%s): no HTTP trigger "
                         "(set %s to another port)", host, port, exc, ENV_PORT)
            return
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="goodput-profile-http", daemon=True)
        self._thread.start()
        _log.info("goodput profile: on-demand capture on http://%s:%s/profile (pid %s)",
                  host, self.port, self.pid)

    def request(self, duration_s=None, session_id: str | None = None) -> tuple[int, dict]:
        """Ask for a capture of ``duration_s`` seconds (what ``POST /profile`` does).

        Returns ``(http_status, body)``: 202 with the session id, 400 on a bad duration,
        409 while a capture is pending or running, 503 when no trigger can run it.
        """
        if duration_s is None:
            duration = self._default_duration()
        else:
            try:
                duration = float(duration_s)
            except (TypeError, ValueError):
                return 400, {"error": f"duration_s must be a number, got {duration_s!r}"}
            if not math.isfinite(duration) or duration <= 0 or duration > self.max_duration_s:
                return 400, {"error": f"duration_s must be > 0 and <= {self.max_duration_s:g}, "
                                      f"got {duration_s!r}"}
        if session_id is not None and not str(session_id).strip():
            return 400, {"error": "session_id must not be empty"}
        direct = self.signum is None
        if direct and _profile.detect_framework(self.framework) != "jax":
            return 503, {"error": "no signal trigger in this process (enable() off the main "
                                  "thread?): only JAX can be captured from a helper thread"}
        with self._lock:
            if self._closed:
                return 503, {"error": "on-demand capture is disabled"}
            busy = self._busy_locked()
            if busy:
                return 409, {"error": busy, **self._status_locked()}
            sid = (_profile._safe(session_id) if session_id is not None
                   else _profile.next_session_id(_profile.ON_DEMAND, _profile.session_prefix(
                       self.run)))
            req = _Request(sid, duration)
            self._pending = req
            if not direct:
                os.kill(self.pid, self.signum)
        if direct:
            threading.Thread(target=self._run_direct, args=(req,), daemon=True,
                             name="goodput-profile-capture").start()
        return 202, {"session_id": sid, "duration_s": duration, "pid": self.pid,
                     "dir": os.path.join(_profile.resolve_dir(self.dir, self.run), sid)}

    def _busy_locked(self) -> str | None:
        if self._pending is not None:
            return f"capture {self._pending.session_id} is pending"
        if self._cap is not None:
            return f"capture {self._cap.session_id} is running"
        other = _profile.active_session()
        if other is not None:
            return f"capture {other} is running"
        return None

    def _default_duration(self) -> float:
        d = self.default_duration_s
        if d is None:
            d = _env_float(ENV_DURATION, DEFAULT_DURATION_S)
        return min(d, self.max_duration_s)

    # --- the main thread ------------------------------------------------------

    def _on_signal(self, signum, frame) -> None:
        """Signal handler (main thread): start the pending capture or stop the running one."""
        if os.getpid() != self.pid:  # a forked child (data loader worker): not ours
            return
        # Never block here: the main thread may have been interrupted while holding one of
        # these locks. Try again a little later instead.
        if not self._lock.acquire(blocking=False):
            self._resignal(0.05)
            return
        try:
            if not _profile._LOCK.acquire(blocking=False):
                self._resignal(0.05)
                return
            _profile._LOCK.release()
            if self._closed:
                return
            if self._cap is not None:
                if self._stop_due or time.monotonic() >= self._deadline:
                    self._stop_locked()
                else:
                    _log.info("goodput profile: capture %s is running: signal ignored",
                              self._cap.session_id)
                return
            req, self._pending = self._pending, None
            if req is None:  # kill -USR2 from outside
                sid = _profile.next_session_id(_profile.ON_DEMAND,
                                               _profile.session_prefix(self.run))
                req = _Request(sid, self._default_duration())
            self._start_locked(req)
            if self._cap is not None:
                self._schedule(req.duration_s, self._stop_due_now)
        except Exception as exc:  # never into the training loop
            self._counts["errors"] += 1
            _log.warning("goodput profile: on-demand trigger failed: %s: %s",
                         type(exc).__name__, exc)
        finally:
            self._lock.release()

    def _start_locked(self, req: _Request) -> None:
        self._current = req
        cap = _profile.start_capture(trigger=_profile.ON_DEMAND, dir=self.dir,
                                     session_id=req.session_id, framework=self.framework,
                                     run=self.run)
        if cap is None:
            self._counts["errors"] += 1
            self._last = {"session_id": req.session_id, "error": "not started (see the log)",
                          "requested_duration_s": req.duration_s}
            self._current = None
            return
        self._cap = cap
        self._started_at = time.time()
        self._deadline = time.monotonic() + req.duration_s
        self._stop_due = False

    def _stop_locked(self) -> None:
        cap, req = self._cap, self._current
        err = _profile.stop_capture(cap)
        if err is not None and "must be stopped on the thread" in err:
            return  # wrong thread (cannot happen from the handler): keep it
        self._cap, self._current = None, None
        self._stop_due = False
        self._counts["captures"] += 1
        if err is not None:
            self._counts["errors"] += 1
        self._last = {
            "session_id": cap.session_id, "dir": cap.dir, "framework": cap.framework,
            "started_at": self._started_at, "ended_at": time.time(),
            "requested_duration_s": req.duration_s if req else None,
            "files": _files(cap.dir), "error": err,
        }

    def _run_direct(self, req: _Request) -> None:
        """Capture on this helper thread (JAX only: its profiler is process-wide)."""
        with self._lock:
            if self._pending is not req or self._closed:
                return
            self._pending = None
            self._start_locked(req)
            if self._cap is None:
                return
            cap = self._cap
        end = time.monotonic() + req.duration_s
        while time.monotonic() < end:
            with self._lock:
                if self._cap is not cap:
                    return
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
        with self._lock:
            if self._cap is cap:
                self._stop_locked()

    def _stop_due_now(self) -> None:
        with self._lock:
            if self._closed or self._cap is None:
                return
            self._stop_due = True
            os.kill(self.pid, self.signum)

    def _resignal(self, delay: float) -> None:
        def fire():
            with self._lock:
                if not self._closed:
                    os.kill(self.pid, self.signum)

        self._schedule(delay, fire)

    def _schedule(self, delay: float, fn) -> None:
        t = threading.Timer(delay, fn)
        t.daemon = True
        self._timers = [x for x in self._timers if x.is_alive()] + [t]
        t.start()

    # --- status and shutdown -------------------------------------------------

    def status(self) -> dict:
        """What ``GET /profile`` answers: ``state`` (idle, pending, capturing), the current
        or pending ``session_id``, ``last`` finished capture, counters, pid and port."""
        with self._lock:
            return self._status_locked()

    def _status_locked(self) -> dict:
        out = {"pid": self.pid, "port": self.port,
               "signal": signal.Signals(self.signum).name if self.signum else None,
               "framework": _profile.detect_framework(self.framework),
               "max_duration_s": self.max_duration_s, **self._counts, "last": self._last}
        if self._cap is not None:
            out.update(state="capturing", session_id=self._cap.session_id, dir=self._cap.dir,
                       started_at=self._started_at,
                       duration_s=self._current.duration_s if self._current else None)
        elif self._pending is not None:
            out.update(state="pending", session_id=self._pending.session_id,
                       duration_s=self._pending.duration_s)
        else:
            other = _profile.active_session()
            out.update(state="busy" if other else "idle", session_id=other)
        return out

    def stop(self) -> None:
        """Stop the triggers (HTTP server, signal handler, timers); a capture still running
        is stopped when this runs on the thread that started it, else at exit."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for t in self._timers:
                t.cancel()
            self._timers = []
            self._pending = None
            if self._cap is not None:
                self._stop_locked()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.signum is not None:
            try:
                if signal.getsignal(self.signum) == self._on_signal:
                    signal.signal(self.signum, self._prev_handler
                                  if self._prev_handler is not None else signal.SIG_DFL)
            except (ValueError, OSError):  # not the main thread: leave it (it ignores signals)
                pass
        atexit.unregister(self.stop)


def _files(path: str, limit: int = 50) -> list[str]:
    out = []
    for root, _dirs, names in os.walk(path):
        for name in sorted(names):
            out.append(os.path.relpath(os.path.join(root, name), path))
            if len(out) >= limit:
                return out
    return sorted(out)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(http.server.BaseHTTPRequestHandler):
    ondemand: OnDemand  # set on the subclass made per server
    server_version = "goodput-profile"

    def _reply(self, code: int, body: dict) -> None:
        data = (json.dumps(body) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path.rstrip("/") != "/profile":
            self._reply(404, {"error": "not found: use /profile"})
            return None
        return urllib.parse.parse_qs(url.query)

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self._route() is not None:
            self._reply(200, self.ondemand.status())

    def do_POST(self):  # noqa: N802
        query = self._route()
        if query is None:
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 65536))
        duration = query.get("duration_s", [None])[-1]
        session = query.get("session_id", [None])[-1]
        code, body = self.ondemand.request(duration, session)
        self._reply(code, body)

    def log_message(self, format, *args):  # noqa: A002 - http.server's signature
        _log.debug("goodput profile http: " + format, *args)


def enable(run=None, *, port: int | None = None, host: str = "127.0.0.1",
           signum=signal.SIGUSR2, dir=None, duration_s: float | None = None,
           framework: str = "auto", max_duration_s: float = MAX_DURATION_S) -> OnDemand:
    """Enable on-demand capture in this process (call it from the main thread).

    Args:
        run: the ML run (``goodput.diagnostics.run``): profile directory, session prefix and
            process index come from it; None: from the current run or goodput's recorder.
        port: HTTP port on ``host``; default ``GOODPUT_PROFILE_PORT``, else 9012; 0: a free
            port (read ``handle.port``); negative: no HTTP endpoint.
        host: address to listen on; loopback by default (the endpoint has no authentication).
        signum: the trigger signal (default SIGUSR2); None: no signal trigger.
        dir: profile root directory (default: as :func:`~goodput.diagnostics.profile.profile`).
        duration_s: capture length of a signal or of a POST without ``duration_s``; default
            ``GOODPUT_PROFILE_DURATION_S`` (read at trigger time), else 10.
        framework: ``"auto"``, ``"jax"`` or ``"torch"`` (see ``profile()``).
        max_duration_s: longest capture a POST may ask for (default 600).

    Returns:
        The :class:`OnDemand` handle (``.port``, ``.status()``, ``.stop()``). Enabling again
        replaces the previous handle. Never raises for a busy port or a signal it cannot
        handle: that trigger is left out with a warning.
    """
    global _HANDLE
    with _HANDLE_LOCK:
        old, _HANDLE = _HANDLE, None
    if old is not None:
        old.stop()
    handle = OnDemand(run, port=port, host=host, signum=signum, dir=dir, duration_s=duration_s,
                      framework=framework, max_duration_s=max_duration_s)
    with _HANDLE_LOCK:
        _HANDLE = handle
    return handle


def disable(run=None) -> None:
    """Stop the on-demand triggers enabled by :func:`enable` (no-op if none).

    With ``run`` (what ``MLRun.end()`` passes), only if they were enabled for that run.
    """
    global _HANDLE
    with _HANDLE_LOCK:
        handle = _HANDLE
        if handle is None or (run is not None and handle.run is not run):
            return
        _HANDLE = None
    if handle is not None:
        handle.stop()


def current() -> OnDemand | None:
    """The handle of :func:`enable`, or None."""
    return _HANDLE
