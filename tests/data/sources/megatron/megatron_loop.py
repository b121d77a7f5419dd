"""A CPU training loop that calls Megatron-LM main's telemetry for real, in pretrain()'s order.

Megatron-LM's ``pretrain()`` needs CUDA throughout, and megatron-core 0.19.2 on PyPI has
no OpenTelemetry spans, so this script imports Megatron-LM main (the commit pinned in
``regenerate.py``) with nemo-lens 0.1.0 and calls, for real, the functions that make its
spans, in the order ``pretrain()`` and ``train()`` call them:

- ``megatron.training.global_vars._set_telemetry(args)`` (nemo-lens ``NemoLensConfig``
  from the ``MEGATRON_OTEL_*`` variables, ``build_telemetry_resource_attrs``,
  ``setup_telemetry``: the OTel SDK's TracerProvider and BatchSpanProcessor);
- ``megatron.training.training``: ``set_startup_timestamps``, ``_start_otel_job_spans``,
  ``_backdated_otel_span`` (the six startup children, same arguments), the nemo-lens
  ``managed_span`` sites (``megatron.startup.model_init``, ``megatron.checkpoint.load``,
  ``megatron.startup.dataloader``, ``megatron.checkpoint.ft_heartbeat``,
  ``megatron.checkpoint.save.finalize``, ``megatron.train.first_iteration``,
  ``megatron.train.iteration`` with ``megatron.iteration``, ``megatron.train.log``),
  ``_end_otel_startup_span``, ``_start_otel_train_span``, ``_maybe_reroot_otel_interval``
  (one ``megatron.train`` root per save interval), ``_otel_trace_fn('evaluate',
  'megatron.evaluate')``, ``_end_otel_train_span`` and ``_end_otel_job_spans``.

What is not Megatron's: the model (a small ``torch.nn.Linear`` trained on CPU, each step
padded to ``--step-s``), the checkpoint (``torch.save`` of that model with the iteration,
fsync'd and renamed), the evaluation, and ``save_checkpoint_and_time``'s span structure,
copied from it (``megatron.checkpoint.exposed_save`` with ``megatron.iteration`` around
``megatron.checkpoint.save``), because the real function needs Megatron's distributed
checkpointing of a GPU model. The spans go to an OTLP JSON lines file (the Collector's
file-exporter format) through ``OtlpJsonLinesExporter``, passed to nemo-lens in place of
the OTLP exporter it would build (``nemo.lens.providers._build_span_exporter``); with
``--otlp-endpoint`` nemo-lens's own OTLP exporter is used (``OTEL_EXPORTER_OTLP_*``).

The loop's truth (``--truth``): one JSON line per event (``start``, ``restore``, ``step``,
``eval``, ``save``, ``end``; times in seconds since the epoch), each flushed and fsync'd
before the loop goes on, so a SIGKILL loses none of it.
"""

import time

PROGRAM_START = time.time()  # pretrain_gpt.py takes it before its imports

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from types import SimpleNamespace  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_shims  # noqa: E402

cpu_shims.install()

import torch  # noqa: E402
from megatron.training import global_vars  # noqa: E402
from megatron.training import training as T  # noqa: E402


class OtlpJsonLinesExporter:
    """OTel SDK ``SpanExporter`` writing each batch as one OTLP JSON line (the Collector's
    file exporter: ``ExportTraceServiceRequest``, ids as hex, enums as integers), flushed
    and fsync'd."""

    def __init__(self, path: str):
        self._f = open(path, "a", encoding="utf-8")

    def export(self, spans):
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace.export import SpanExportResult

        doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        _hex_ids(doc)
        self._f.write(json.dumps(doc, separators=(",", ":")) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self._f.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _hex_ids(node):
    import base64

    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                node[k] = base64.b64decode(v).hex()
            else:
                _hex_ids(v)
    elif isinstance(node, list):
        for v in node:
            _hex_ids(v)


class Truth:
    """The loop's own record: JSON lines, each fsync'd before the loop goes on."""

    def __init__(self, path: str):
        self._f = open(path, "a", encoding="utf-8")

    def __call__(self, ev: str, **kw):
        kw.update(ev=ev, pid=os.getpid())
        self._f.write(json.dumps(kw) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())


def _pad(t0: float, seconds: float) -> None:
    left = t0 + seconds - time.time()
    if left > 0:
        time.sleep(left)


def save_checkpoint_and_time(iteration, model, ckpt, save_s, truth):
    """``save_checkpoint_and_time``'s spans (copied from Megatron-LM main), around a
    ``torch.save`` of the model."""
    from opentelemetry import context as octx
    from opentelemetry import trace as otr

    t0 = time.time()
    span = token = None
    if T._otel_sg_enabled("checkpoint"):
        span = T.get_telemetry().tracer.start_span("megatron.checkpoint.exposed_save")
        T._otel_mark_goodput(span)
        span.set_attribute("megatron.iteration", iteration)
        token = octx.attach(otr.set_span_in_context(span))
    try:
        with T._otel_managed_span("checkpoint", "megatron.checkpoint.save",
                                  is_goodput_span=True, **{"megatron.iteration": iteration}):
            tmp = ckpt + ".tmp"
            with open(tmp, "wb") as f:
                torch.save({"iteration": iteration, "model": model.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, ckpt)
            _pad(t0, save_s)
        with T._otel_managed_span("step", "megatron.checkpoint.timers_log",
                                  is_goodput_span=True):
            pass
    finally:
        if span is not None:
            octx.detach(token)
            span.end()
    truth("save", step=iteration, start=t0, end=time.time())


def main() -> None:
    main_entry = time.time()
    T.set_startup_timestamps(program_start=PROGRAM_START, main_entry=main_entry)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--otlp-file", help="OTLP JSON lines file the spans are appended to")
    ap.add_argument("--otlp-endpoint", action="store_true",
                    help="export with nemo-lens's own OTLP exporter (OTEL_EXPORTER_OTLP_*)")
    ap.add_argument("--truth", required=True)
    ap.add_argument("--ckpt", required=True, help="checkpoint file (loaded when present)")
    ap.add_argument("--train-iters", type=int, default=12)
    ap.add_argument("--save-interval", type=int, default=4)
    ap.add_argument("--eval-interval", type=int, default=6)
    ap.add_argument("--step-s", type=float, default=0.15)
    ap.add_argument("--init-s", type=float, default=0.2, help="initialize_megatron stand-in")
    ap.add_argument("--model-s", type=float, default=0.2)
    ap.add_argument("--load-s", type=float, default=0.25)
    ap.add_argument("--data-s", type=float, default=0.1)
    ap.add_argument("--save-s", type=float, default=0.3)
    ap.add_argument("--eval-s", type=float, default=0.2)
    a = ap.parse_args()
    truth = Truth(a.truth)
    truth("start", t=PROGRAM_START)

    # pretrain(): the startup timestamps, then initialize_megatron (here: the args and
    # Megatron's own _set_telemetry; the distributed/CUDA set-up is a pause).
    T._STARTUP_TIMESTAMPS["pretrain_entry"] = time.time()
    ts_inprocess = time.time()
    ts_in_job = time.time()
    args = SimpleNamespace(
        rank=0, world_size=1, local_rank=0, tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1, data_parallel_size=1, global_batch_size=8,
        seq_length=16, num_layers=1, num_attention_heads=1, hidden_size=16,
        train_iters=a.train_iters, micro_batch_size=8, ckpt_format="torch",
        save_interval=a.save_interval, eval_interval=a.eval_interval, bf16=False, fp16=False,
        otel_enabled=True, otel_service_name=None, otel_span_groups=None)
    global_vars.set_args(args)
    if a.otlp_file:
        import nemo.lens.providers as providers

        exporter = OtlpJsonLinesExporter(a.otlp_file)
        providers._build_span_exporter = lambda config: exporter
    global_vars._set_telemetry(args)
    _pad(ts_in_job, a.init_s)
    ts_initialize = time.time()
    ts_jit = time.time()  # set_jit_fusion_options: nothing to warm up on CPU

    T._start_otel_job_spans("encoder_or_decoder", PROGRAM_START)
    T._backdated_otel_span("megatron.startup.imports", PROGRAM_START, main_entry)
    T._backdated_otel_span("megatron.startup.arg_parse", main_entry,
                           T._STARTUP_TIMESTAMPS["pretrain_entry"])
    T._backdated_otel_span("megatron.startup.inprocess_setup",
                           T._STARTUP_TIMESTAMPS["pretrain_entry"], ts_inprocess)
    T._backdated_otel_span("megatron.startup.in_job_setup", ts_inprocess, ts_in_job)
    T._backdated_otel_span("megatron.startup.initialize_megatron", ts_in_job, ts_initialize)
    T._backdated_otel_span("megatron.startup.jit_fusion_options", ts_initialize, ts_jit)

    iteration = 0
    with T._otel_managed_span("model_init", "megatron.startup.model_init",
                              is_goodput_span=True):
        t0 = time.time()
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        _pad(t0, a.model_s)
        if os.path.exists(a.ckpt):
            with T._otel_managed_span("load_checkpoint", "megatron.checkpoint.load",
                                      is_goodput_span=True):
                t0 = time.time()
                state = torch.load(a.ckpt)
                model.load_state_dict(state["model"])
                iteration = int(state["iteration"])
                _pad(t0, a.load_s)
            truth("restore", step=iteration, start=t0, end=time.time())
    with T._otel_managed_span("data_loading", "megatron.startup.dataloader",
                              is_goodput_span=True):
        t0 = time.time()
        data = torch.randn(8, 16)
        _pad(t0, a.data_s)

    @T._otel_trace_fn("evaluate", "megatron.evaluate")
    def evaluate():
        t0 = time.time()
        with torch.no_grad():
            model(data).pow(2).mean().item()
        _pad(t0, a.eval_s)

    # train(): startup ends, the loop re-roots one megatron.train per save interval.
    T._end_otel_startup_span()
    T._start_otel_train_span()
    first = True
    while iteration < a.train_iters:
        T._maybe_reroot_otel_interval()
        with T._otel_managed_span("checkpoint", "megatron.checkpoint.ft_heartbeat",
                                  is_goodput_span=True):
            pass
        with T._otel_managed_span("checkpoint", "megatron.checkpoint.save.finalize",
                                  is_goodput_span=True):
            pass
        first_cm = (T._otel_managed_span("first_iteration", "megatron.train.first_iteration",
                                         is_goodput_span=True,
                                         **{"megatron.iteration": iteration})
                    if first else nullcontext())
        with first_cm, T._otel_managed_span("step", "megatron.train.iteration",
                                            is_goodput_span=True,
                                            **{"megatron.iteration": iteration}) as sp:
            t0 = time.time()
            opt.zero_grad()
            model(data).pow(2).mean().backward()
            opt.step()
            _pad(t0, a.step_s)
            t1 = time.time()
            if sp is not None:
                T._otel_safe_set_attrs(sp, {"megatron.skipped": False})
        iteration += 1
        truth("step", step=iteration, start=t0, end=t1)
        with T._otel_managed_span("step", "megatron.train.log", is_goodput_span=True):
            pass
        first = False
        if a.eval_interval and iteration % a.eval_interval == 0:
            t0 = time.time()
            evaluate()
            truth("eval", step=iteration, start=t0, end=time.time())
        if a.save_interval and iteration % a.save_interval == 0:
            save_checkpoint_and_time(iteration, model, a.ckpt, a.save_s, truth)
    T._end_otel_train_span()
    if a.save_interval and iteration % a.save_interval != 0:
        save_checkpoint_and_time(iteration, model, a.ckpt, a.save_s, truth)
    truth("end", t=time.time())
    T._end_otel_job_spans()


if __name__ == "__main__":
    main()
