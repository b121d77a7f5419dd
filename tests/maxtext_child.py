"""A MaxText-shaped training program on a small real JAX loop (CPU), for
``tests/compat/test_maxtext_integration.py``.

Its goodput code is MaxText's, with one change: the import. The functions below
(``GoodputEvent``, ``maybe_monitor_goodput``, ``maybe_record_goodput``, ``record_goodput``,
``create_goodput_recorder``) reproduce the call shapes of MaxText's
``src/maxtext/common/goodput.py``, and the elastic ones (``record_slice_state``,
``record_elastic_event_start``, ``record_elastic_wait_end_and_reinit_start``,
``record_elastic_reinit_end``) those of ``src/maxtext/utils/elastic_utils.py``
(AI-Hypercomputer/maxtext, read for this test; the slice counts come from a fake slice
manager instead of ``pathwaysutils``). ``train_loop`` and ``main`` follow the order of
``src/maxtext/trainers/pre_train/train.py`` and ``utils/train_utils.setup_train_loop``:
job start, the monitor around the training, TPU init and training preparation, data
loading and the step inside ``maybe_record_goodput``, Orbax checkpoints, the job end in
the ``finally`` of a graceful run. One elastic event (a slice goes down inside a step)
is handled the way ``elastic_utils.elastic_retry`` handles it: wait, reinitialise, run the
train function again from the latest checkpoint.

Usage: ``python maxtext_child.py CONFIG_JSON``; prints ``STEP n`` after each step (the
parent kills it at one of them) and ``DONE`` at the end. The run directory comes from
``GOODPUT_RUN_DIR`` (where ``goodput.mgm`` looks, ``logger_name`` unchanged).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from enum import Enum
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from goodput.mgm import goodput, monitoring  # was: from ml_goodput_measurement import ...

# --- MaxText src/maxtext/common/goodput.py (call shapes) ------------------------------------


class GoodputEvent(Enum):
    JOB = "job"
    TPU_INIT = "tpu_init"
    TRAINING_PREPARATION = "training_preparation"
    DATA_LOADING = "data_loading"
    STEP = "step"


RECORD_JOB_START_TIME = f"record_{GoodputEvent.JOB.value}_start_time"
RECORD_JOB_END_TIME = f"record_{GoodputEvent.JOB.value}_end_time"


@contextlib.contextmanager
def maybe_monitor_goodput(config):
    if not config.monitor_goodput:
        yield
        return
    goodput_monitor = None
    try:
        if config.report_performance_metric_for_gcp_monitoring:
            config.enable_gcp_step_deviation_metrics = False
        gcp_options = monitoring.GCPOptions(
            enable_gcp_goodput_metrics=config.enable_gcp_goodput_metrics,
            enable_gcp_step_deviation_metrics=config.enable_gcp_step_deviation_metrics,
        )
        monitor_class = monitoring.GoodputMonitor
        if config.elastic_enabled:
            try:
                from goodput.mgm import monitoring_elastic  # was: ml_goodput_measurement

                monitor_class = monitoring_elastic.ElasticGoodputMonitor
            except ImportError:
                print("Elastic monitor failed!", flush=True)
        kwargs = {
            "job_name": config.run_name,
            "logger_name": f"goodput_{config.run_name}",
            "tensorboard_dir": config.tensorboard_dir,
            "upload_interval": config.goodput_upload_interval_seconds,
            "monitoring_enabled": True,
            "include_badput_breakdown": True,
            "include_step_deviation": config.monitor_step_time_deviation,
            "step_deviation_interval_seconds": config.step_deviation_interval_seconds,
            "gcp_options": gcp_options,
        }
        if monitor_class == monitoring.GoodputMonitor:
            kwargs["pathway_enabled"] = config.enable_pathways_goodput
        goodput_monitor = monitor_class(**kwargs)
        goodput_monitor.start_goodput_uploader()
        yield
    finally:
        if goodput_monitor:
            goodput_monitor.stop_goodput_uploader()


@contextlib.contextmanager
def maybe_record_goodput(recorder, event_name, *args):
    record_goodput(recorder, f"record_{event_name.value}_start_time", *args)
    completed = False
    try:
        yield
        completed = True
    finally:
        if completed:
            record_goodput(recorder, f"record_{event_name.value}_end_time", *args)


def record_goodput(recorder, event_name, *args):
    if recorder:
        record_func = getattr(recorder, event_name, None)
        if record_func:
            record_func(*args)


def create_goodput_recorder(config):
    if not config.enable_goodput_recording:
        return None
    logger_name = f"goodput_{config.run_name}"
    if config.elastic_enabled:
        try:
            from goodput.mgm import goodput_elastic  # was: ml_goodput_measurement

            recorder = goodput_elastic.ElasticGoodputRecorder(config.run_name, logger_name,
                                                              jax.process_index() == 0)
            record_slice_state(recorder)
        except ImportError as e:
            print(f"Could not create elastic goodput recorder: {e}", flush=True)
        else:
            return recorder
    return goodput.GoodputRecorder(config.run_name, logger_name, jax.process_index() == 0)


# --- MaxText src/maxtext/utils/elastic_utils.py (call shapes) --------------------------------

SLICES = SimpleNamespace(total=4, active=4, available=4)  # stands in for pathwaysutils
pending_reinit_recorder = None
pending_elastic_event_type = None


def record_slice_state(recorder, active_slices_override: int | None = None) -> None:
    if recorder is None or not hasattr(recorder, "record_elastic_slice_counts"):
        return
    recorder.record_elastic_slice_counts(
        available_slices=SLICES.available,
        active_slices=(active_slices_override if active_slices_override is not None
                       else SLICES.active),
        total_slices=SLICES.total,
    )


def record_elastic_event_start(recorder, scale_up: bool) -> None:
    global pending_elastic_event_type
    event_type = "elastic_scale_up" if scale_up else "elastic_slice_down"
    pending_elastic_event_type = event_type
    if recorder and hasattr(recorder, "record_elastic_wait_start_time"):
        recorder.record_elastic_wait_start_time(event_type=event_type)
        record_slice_state(recorder, active_slices_override=0)


def record_elastic_wait_end_and_reinit_start(recorder) -> None:
    global pending_reinit_recorder, pending_elastic_event_type
    if pending_elastic_event_type is None:
        return
    event_type = pending_elastic_event_type
    pending_elastic_event_type = None
    if recorder and hasattr(recorder, "record_elastic_wait_end_time"):
        recorder.record_elastic_wait_end_time(event_type=event_type)
        recorder.record_elastic_reinit_start_time()
        record_slice_state(recorder)
    pending_reinit_recorder = recorder


def record_elastic_reinit_end() -> None:
    global pending_reinit_recorder
    if pending_reinit_recorder is not None and hasattr(pending_reinit_recorder,
                                                       "record_elastic_reinit_end_time"):
        pending_reinit_recorder.record_elastic_reinit_end_time()
        record_slice_state(pending_reinit_recorder)
    pending_reinit_recorder = None


class SliceDown(RuntimeError):
    """Stands in for the ``jax.errors.JaxRuntimeError`` of a slice that went down."""


# --- the training -----------------------------------------------------------------------------


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


@jax.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss


def setup_train_loop(config, recorder):
    """``train_utils.setup_train_loop``: TPU init, then training preparation (model,
    checkpoint manager, restore)."""
    with maybe_record_goodput(recorder, GoodputEvent.TPU_INIT):
        rng = jax.random.PRNGKey(0)
        jax.devices()
    with maybe_record_goodput(recorder, GoodputEvent.TRAINING_PREPARATION):
        k1, k2 = jax.random.split(rng)
        params = {"w1": jax.random.normal(k1, (16, 32)) * 0.1, "b1": jnp.zeros(32),
                  "w2": jax.random.normal(k2, (32, 1)) * 0.1}
        manager = ocp.CheckpointManager(config.checkpoint_dir,
                                        options=ocp.CheckpointManagerOptions(max_to_keep=3))
        start_step = 0
        latest = manager.latest_step()
        if latest is not None:
            params = manager.restore(latest, args=ocp.args.StandardRestore(params))
            start_step = latest
    return params, manager, start_step


def load_next_batch(recorder, step):
    with maybe_record_goodput(recorder, GoodputEvent.DATA_LOADING):
        rng = np.random.default_rng(step)
        x = rng.normal(size=(64, 16)).astype(np.float32)
        return x, x[:, :1] * 0.5


def train_loop(config, recorder, state):
    params, manager, start_step = setup_train_loop(config, recorder)
    record_elastic_reinit_end()
    _job_completed_gracefully = False
    try:
        for step in np.arange(start_step, config.steps):
            x, y = load_next_batch(recorder, int(step))
            with maybe_record_goodput(recorder, GoodputEvent.STEP, step):
                params, loss = train_step(params, x, y)
                loss.block_until_ready()
                time.sleep(config.step_sleep)
                if step == config.slice_down_at_step and not state.slice_went_down:
                    state.slice_went_down = True
                    raise SliceDown(f"slice 3 went down in step {step}")
            if (step + 1) % config.checkpoint_period == 0:
                manager.save(int(step) + 1, args=ocp.args.StandardSave(params))
            print(f"STEP {int(step)}", flush=True)
        manager.wait_until_finished()
        _job_completed_gracefully = True
    finally:
        if _job_completed_gracefully:
            record_goodput(recorder, RECORD_JOB_END_TIME)
        manager.close()


def elastic_train(config, recorder):
    """``elastic_utils.elastic_retry`` around the train function: on an elastic event, the
    event callback, the wait for slices, then ``initialize`` (a new recorder) and the train
    function again."""
    state = SimpleNamespace(slice_went_down=False)
    while True:
        try:
            train_loop(config, recorder, state)
            return
        except SliceDown as e:
            print(f"elastic event: {e}", flush=True)
            SLICES.available = 3
            record_elastic_event_start(recorder, scale_up=False)
            time.sleep(config.elastic_wait_s)  # waiting for the slices to be ready
            SLICES.active = 3
            record_elastic_wait_end_and_reinit_start(recorder)
            recorder = create_goodput_recorder(config)  # initialize(argv) of the retry


def main(config) -> None:
    recorder = create_goodput_recorder(config)
    record_goodput(recorder, RECORD_JOB_START_TIME)
    with maybe_monitor_goodput(config):
        elastic_train(config, recorder)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(SimpleNamespace(**json.loads(sys.argv[1])))
