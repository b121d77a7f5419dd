"""Automatic goodput instrumentation: JAX, Orbax, PyTorch, Lightning, Hugging Face Trainer.

One line at the top of a training script records steps, data loading,
compilation, checkpoint save and restore without any other change::

    import goodput_instrumentation; goodput_instrumentation.instrument()

or, with no change to the script at all::

    opentelemetry-instrument python train.py

Each framework has an OpenTelemetry ``BaseInstrumentor`` (registered under the
``opentelemetry_instrumentor`` entry point). Nothing is imported or patched
until the training script imports the framework; frameworks that are not
installed are skipped. ``docs/instrumentation/`` says, per framework, what is
captured and what still needs a marker from the phase API.
"""

from __future__ import annotations

import importlib
import logging

_log = logging.getLogger("goodput.instrumentation")

#: Entry-point name -> "module:Class" of every instrumentor, in instrumenting order.
INSTRUMENTORS = {
    "goodput_jax": "goodput_instrumentation.jax:JaxInstrumentor",
    "goodput_orbax": "goodput_instrumentation.orbax:OrbaxInstrumentor",
    "goodput_torch": "goodput_instrumentation.torch:TorchInstrumentor",
    "goodput_lightning": "goodput_instrumentation.lightning:LightningInstrumentor",
    "goodput_transformers": "goodput_instrumentation.transformers:TransformersInstrumentor",
}

_SHORT = {name.removeprefix("goodput_"): name for name in INSTRUMENTORS}


def _load(name: str):
    module, cls = INSTRUMENTORS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def instrument(frameworks=None, **kwargs) -> list[str]:
    """Instrument the given frameworks (default: all) for goodput; returns those enabled.

    Args:
        frameworks: names among ``jax``, ``orbax``, ``torch``, ``lightning``,
            ``transformers`` (an iterable), or None for all of them. A
            framework that is not installed costs nothing: it is patched only if
            the script imports it.
        **kwargs: options, passed to each instrumentor's ``instrument()``:
            ``step_offset`` (JAX), ``detect_eval`` (PyTorch); see their pages.

    Returns:
        The short names of the instrumentors now enabled.

    Raises:
        ValueError: an unknown framework name or option (names the valid ones).
    """
    names = list(_SHORT) if frameworks is None else list(frameworks)
    unknown = [n for n in names if n not in _SHORT]
    if unknown:
        raise ValueError(
            f"instrument(frameworks=...): unknown {unknown}; choose from {sorted(_SHORT)}"
        )
    loaded = []
    for short in names:
        try:
            loaded.append((short, _load(_SHORT[short])))
        except Exception as exc:  # noqa: BLE001 - one broken instrumentor must not stop the rest
            _log.warning("goodput: instrumentor %s unavailable: %r", short, exc)
    known = {opt for _, inst in loaded for opt in inst.options}
    bad = sorted(set(kwargs) - known)
    if bad:
        raise ValueError(f"instrument(): unknown option(s) {bad}; these take {sorted(known)}")
    enabled = []
    for short, inst in loaded:
        if not inst.is_instrumented_by_opentelemetry:
            inst.instrument(skip_dep_check=True, **kwargs)
        enabled.append(short)
    return enabled


def uninstrument(frameworks=None) -> None:
    """Undo :func:`instrument` for the given frameworks (default: all): every patch is removed."""
    names = list(_SHORT) if frameworks is None else list(frameworks)
    for short in names:
        if short not in _SHORT:
            raise ValueError(
                f"uninstrument(frameworks=...): unknown {short!r}; choose from {sorted(_SHORT)}"
            )
        inst = _load(_SHORT[short])
        if inst.is_instrumented_by_opentelemetry:
            inst.uninstrument()


__all__ = ["INSTRUMENTORS", "instrument", "uninstrument"]
