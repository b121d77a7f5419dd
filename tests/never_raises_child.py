"""Child of ``tests/recorder/test_never_raises.py``: runs goodput's public recording calls with the
arguments it is given, in a real process, under whatever environment it was started with.

    python tests/never_raises_child.py PROGRAM.json

PROGRAM: ``{"configure": {kwargs}, "calls": [[function, [args], {kwargs}, use], ...],
"torch": bool}``. A value ``{"__np__": x}`` is ``numpy.asarray(x)`` (``x`` a number: a 0-d
array), ``{"__torch__": x}`` is ``torch.tensor(x)``, ``{"__obj__": 0}`` a bare ``object()``.
``use``: ``"with"`` (a context manager), ``"decorate"`` (a decorator of a function then
called), ``"begin_finish"`` or ``"call"`` (the return value left as it is). After the calls
it records steps 1000..1004 and a checkpoint save with plain arguments, flushes, and prints
one JSON line: ``{"end": true, "stats": ...}``. Any exception that reaches this script
makes it exit 1 with the traceback (the test fails on it).
"""

from __future__ import annotations

import json
import sys


def _value(v, torch):
    if isinstance(v, dict):
        if "__np__" in v:
            import numpy as np

            return np.asarray(v["__np__"])
        if "__torch__" in v:
            return torch.tensor(v["__torch__"])
        if "__obj__" in v:
            return object()
        return {k: _value(x, torch) for k, x in v.items()}
    if isinstance(v, list):
        return [_value(x, torch) for x in v]
    return v


def main() -> None:
    with open(sys.argv[1]) as f:
        program = json.load(f)
    torch = None
    if program.get("torch"):
        import torch
    import goodput

    kwargs = _value(program.get("configure") or {}, torch)
    if program.get("configure") is not None:
        goodput.configure(**kwargs)
    for name, args, kw, use in program["calls"]:
        fn = getattr(goodput, name)
        got = fn(*_value(args, torch), **_value(kw, torch))
        if use == "with":
            with got:
                pass
        elif use == "decorate":
            def work():
                return 7

            wrapped = got(work) if callable(got) else work
            assert wrapped() == 7
        elif use == "begin_finish":
            got.begin()
            got.finish()
    for n in range(1000, 1005):
        with goodput.step(n):
            pass
    with goodput.checkpoint_save(step=1004):
        pass
    goodput.flush()
    stats = goodput.get_recorder().stats()
    print(json.dumps({"end": True, "stats": {k: v for k, v in stats.items()
                                             if isinstance(v, (int, str, type(None)))}}))


if __name__ == "__main__":
    main()
