"""goodput: goodput and badput of ML training jobs, recorded as OpenTelemetry spans.

The training side. Mark the phases of a training loop; each becomes a span that
the processor (``goodput report``) turns into goodput and a badput breakdown::

    import goodput
    goodput.configure(job_name="my-run")        # first thing in the script
    with goodput.training_prep():
        model, opt, data = build()
    for n, batch in enumerate(data):
        with goodput.step(n):
            train_step(model, opt, batch)
        if n % 100 == 0:
            with goodput.checkpoint_save(step=n):
                save(model, n)

See ``docs/span-schema.md`` for the spans and ``docs/accounting.md`` for the buckets.
"""

import importlib

from goodput import schema

# The public names and the module each comes from: imported on first use (PEP 562), so that
# ``import goodput.schema`` (the collector side's one import of this package) and
# ``import goodput`` cost only what is used.
_LAZY = {
    **dict.fromkeys(("configure", "flush", "get_recorder", "job_end", "job_start",
                     "shutdown", "step_start"), "goodput.api"),
    **dict.fromkeys(("Phase", "accelerator_init", "checkpoint_restore", "checkpoint_save",
                     "collective_wait", "custom_badput", "data_loading", "program_startup",
                     "step", "training_prep"), "goodput.phases"),
    "Recorder": "goodput.recorder",
    # ml-goodput-measurement's recorder (:class:`goodput.mgm.goodput.GoodputRecorder`)
    "GoodputRecorder": "goodput.mgm.goodput",
}


def __getattr__(name: str):
    """The public names of :data:`_LAZY`, imported from their module on first use.

    Raises:
        AttributeError: ``name`` is none of them.
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'goodput' has no attribute {name!r}")
    if module != "goodput.mgm.goodput":
        # the recording API loads as one (phases imports api, which imports the recorder):
        # ``goodput.configure()`` before the loop, and no phase imports inside it
        importlib.import_module("goodput.phases")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def instrument(frameworks=None, **kwargs) -> list[str]:
    """Record goodput automatically from JAX, Orbax, PyTorch, Lightning and HF Trainer.

    The one-line alternative to marking phases: see
    :func:`goodput_instrumentation.instrument` (this forwards to it) and
    ``docs/instrumentation/``. Returns the short names of the frameworks enabled.

    Never raises: an unknown name in ``frameworks`` or an unknown option (or any other
    failure) is logged as a warning naming it, and nothing is instrumented (``[]``);
    :func:`goodput_instrumentation.instrument` itself raises ``ValueError`` for those.
    """
    try:
        from goodput_instrumentation import instrument as _instrument

        return _instrument(frameworks, **kwargs)
    except Exception as exc:
        import logging

        logging.getLogger(__name__).warning(
            "goodput: goodput.instrument(%r%s) failed: %s; nothing instrumented", frameworks,
            "".join(f", {k}={v!r}" for k, v in kwargs.items()), exc)
        return []


def uninstrument(frameworks=None) -> None:
    """Undo :func:`instrument` (default: for every framework); forwards to
    :func:`goodput_instrumentation.uninstrument`. Never raises (an unknown name is logged)."""
    try:
        from goodput_instrumentation import uninstrument as _uninstrument

        _uninstrument(frameworks)
    except Exception as exc:
        import logging

        logging.getLogger(__name__).warning("goodput: goodput.uninstrument(%r) failed: %s",
                                            frameworks, exc)


__version__ = "0.1.0"

__all__ = [
    "GoodputRecorder",
    "Phase",
    "Recorder",
    "accelerator_init",
    "checkpoint_restore",
    "checkpoint_save",
    "collective_wait",
    "configure",
    "custom_badput",
    "data_loading",
    "flush",
    "get_recorder",
    "instrument",
    "job_end",
    "job_start",
    "program_startup",
    "schema",
    "shutdown",
    "step",
    "step_start",
    "training_prep",
    "uninstrument",
]
