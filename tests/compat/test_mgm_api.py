"""``goodput.mgm`` has the API of the real ``ml-goodput-measurement`` 0.2.3, module by module:
every public class, function, enum and constant of its ``goodput``, ``goodput_utils``,
``goodput_elastic``, ``monitoring``, ``monitoring_elastic`` and ``exclusion_utils`` modules
(but the Cloud Logging and GCS plumbing listed in :data:`NOT_MIRRORED`), with the same
parameters (names, order, kinds, defaults; ours may add keyword-only ones), the same enum
members and values, dataclass fields and ``TypedDict`` keys. Read from the installed
incumbent with ``inspect``, so a new incumbent release shows up here.

Also: importing every module of ``goodput.mgm`` imports no part of the processor.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import subprocess
import sys
import types
import typing

import pytest

pytest.importorskip("ml_goodput_measurement.src.goodput")

MODULES = ("goodput", "goodput_utils", "goodput_elastic", "monitoring", "monitoring_elastic",
           "exclusion_utils")
#: Public names of the incumbent's modules that have no counterpart, and why.
NOT_MIRRORED = {
    # Cloud Logging reader/writer, its local+GCS cache, Orbax's Cloud Logging statistics:
    # here the run directory (spool) is the log, read by the processor.
    "CheckpointBadputCalculator", "CheckpointLoggerOptions", "GoodputCache",
    # the Cloud Monitoring client wrapper: goodput_processor.exporters.workload.WorkloadSender
    "GCPMetrics", "ValueType",
    # urllib3's Retry, re-exported by goodput_utils for its metadata requests
    "Retry",
    "logger",
}
#: Deliberate differences of a parameter, by "qualified name.parameter".
PARAMETER_DIFFERENCES = {
    # a default where the incumbent has none (the run directory does not need it)
    "GoodputRecorder.__init__.logger_name",
    "ElasticGoodputRecorder.__init__.logger_name",
    "GoodputCalculator.__init__.logger_name",
    "ElasticGoodputCalculator.__init__.logger_name",
    # the incumbent evaluates datetime.now() once, at import, for every instance
    "GoodputInfo.__init__.last_updated_timestamp",
}


def _public(module) -> dict:
    return {n: v for n, v in vars(module).items() if not n.startswith("_")
            and not inspect.ismodule(v) and getattr(v, "__module__", "") not in (
                "typing", "typing_extensions")
            and n not in ("Any", "Optional", "Union", "List", "Tuple", "Dict", "TypedDict")}


def _same_default(a, b) -> bool:
    """Defaults of mirrored types compare by content (each side has its own classes)."""
    if isinstance(b, enum.Enum):
        return isinstance(a, enum.Enum) and (a.name, a.value) == (b.name, b.value)
    if dataclasses.is_dataclass(b) and not isinstance(b, type):
        return dataclasses.is_dataclass(a) and dataclasses.asdict(a) == dataclasses.asdict(b)
    return a == b


def _check_signature(qual: str, theirs, ours) -> None:
    ps_t = list(inspect.signature(theirs).parameters.values())
    ps_o = list(inspect.signature(ours).parameters.values())
    assert len(ps_o) >= len(ps_t), f"{qual}: fewer parameters than the incumbent's"
    for t, o in zip(ps_t, ps_o):  # noqa: B905 - ours may have more, keyword-only
        assert (o.name, o.kind) == (t.name, t.kind), f"{qual}: {o} is not {t}"
        if f"{qual}.{t.name}" in PARAMETER_DIFFERENCES:
            continue
        assert _same_default(o.default, t.default), (
            f"{qual}.{t.name}: default {o.default!r} != {t.default!r}")
    for o in ps_o[len(ps_t):]:
        assert o.kind in (o.KEYWORD_ONLY, o.VAR_KEYWORD), f"{qual}: extra {o} not keyword-only"


def _check(qual: str, theirs, ours) -> int:
    """Compare one public object; returns how many checks were made."""
    if isinstance(theirs, types.GenericAlias):  # UnproductiveTimeDict
        assert typing.get_origin(ours) is typing.get_origin(theirs), qual
        assert [getattr(a, "__name__", str(a)) for a in typing.get_args(ours)] == [
            getattr(a, "__name__", str(a)) for a in typing.get_args(theirs)], qual
        return 1
    if isinstance(theirs, type) and issubclass(theirs, enum.Enum):
        extra = {m.name for m in ours} - {m.name for m in theirs}
        assert extra <= {"TRAINING_SLOWDOWN"}, f"{qual}: extra members {extra}"
        for m in theirs:
            assert ours[m.name].value == m.value, f"{qual}.{m.name}"
        return len(theirs)
    if isinstance(theirs, type) and typing.is_typeddict(theirs):
        assert typing.get_type_hints(ours).keys() == typing.get_type_hints(theirs).keys(), qual
        return 1
    if isinstance(theirs, type):
        n = 0
        if dataclasses.is_dataclass(theirs):
            ft = [(f.name, f.default) for f in dataclasses.fields(theirs)]
            assert [(f.name, f.default) for f in dataclasses.fields(ours)] == ft, qual
            n += 1
        for name, member in vars(theirs).items():
            if name.startswith("_") and name != "__init__" or not callable(member):
                continue
            assert hasattr(ours, name), f"{qual}.{name} is missing"
            _check_signature(f"{qual}.{name}", member, getattr(ours, name))
            n += 1
        for base in theirs.__mro__[1:]:  # inherited public methods (e.g. the mixin's)
            for name, member in vars(base).items():
                if not name.startswith("_") and callable(member) and base is not object:
                    assert hasattr(ours, name), f"{qual}.{name} (from {base.__name__})"
                    _check_signature(f"{qual}.{name}", getattr(theirs, name),
                                     getattr(ours, name))
                    n += 1
        return n
    if callable(theirs):
        _check_signature(qual, theirs, ours)
        return 1
    assert isinstance(theirs, (list, dict, str, int, float)), (qual, theirs)
    assert ours == theirs, qual
    return 1


@pytest.mark.parametrize("module", MODULES)
def test_module_mirrors_the_incumbent(module):
    theirs = importlib.import_module(f"ml_goodput_measurement.src.{module}")
    ours = importlib.import_module(f"goodput.mgm.{module}")
    checked = 0
    for name, obj in _public(theirs).items():
        if name in NOT_MIRRORED:
            assert not hasattr(ours, name) or name == "logger", name
            continue
        assert hasattr(ours, name), f"goodput.mgm.{module}.{name} is missing"
        checked += _check(f"{name}", obj, getattr(ours, name))
    assert checked >= 1


def test_the_classes_a_user_calls_are_all_there():
    from goodput.mgm import goodput, goodput_elastic, monitoring, monitoring_elastic

    methods = {
        goodput.GoodputRecorder: 12, goodput.GoodputCalculator: 7,
        goodput_elastic.ElasticGoodputRecorder: 5, monitoring.GoodputMonitor: 8,
        monitoring_elastic.ElasticGoodputMonitor: 8,
    }
    for cls, at_least in methods.items():
        public = [n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))]
        assert len(public) >= at_least, (cls, public)
    # the interval uploader of releases before 0.2, which the issue names
    assert callable(monitoring.GoodputMonitor.start_goodput_interval_uploader)


def test_importing_the_package_leaves_the_processor_alone():
    code = ("import sys, goodput\n"
            "from goodput.mgm import goodput as g, monitoring, goodput_elastic, "
            "monitoring_elastic, goodput_utils, exclusion_utils\n"
            "r = g.GoodputRecorder('j', 'goodput_j', logging_enabled=False)\n"
            "m = monitoring.GoodputMonitor('j', 'goodput_j', '/tmp/tb', 30)\n"
            "m.start_goodput_uploader(); m.stop_goodput_uploader()\n"
            "bad = sorted(n for n in sys.modules if n.startswith('goodput_processor'))\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]"


def test_the_old_compat_modules_are_aliases():
    import goodput
    import goodput.compat
    import goodput_processor.compat
    from goodput.mgm import goodput as mgm_goodput

    assert goodput.compat.GoodputRecorder is mgm_goodput.GoodputRecorder
    assert goodput.GoodputRecorder is mgm_goodput.GoodputRecorder
    for name in ("BadputType", "GoodputCalculator", "GoodputType", "IntervalMetricType",
                 "MetricType"):
        assert getattr(goodput_processor.compat, name) is getattr(mgm_goodput, name)
    with pytest.raises(AttributeError):
        goodput_processor.compat.Nothing  # noqa: B018
