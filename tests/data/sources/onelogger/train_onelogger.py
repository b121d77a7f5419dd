"""A small real Lightning training on CPU, instrumented with NVIDIA one-logger 2.3.1's
Lightning integration, exporting its spans through one-logger's ``OTelExporter``.

Run it with the tool venv (``venv.sh``): lightning 2.5.6, nv-one-logger-* 2.3.1, torch from
the main environment. One process = one attempt. What it does, in order:

1. ``hook_trainer_cls(TruthTrainer, provider)`` (one-logger's ``on_app_start``: the
   ``application`` span opens); ``distributed_code_initialization`` around the seeding and
   thread setup (a single CPU process: no process group); ``model_initialization``,
   ``data_loader_initialization``, ``optimizer_initialization`` (the app calls them, as
   one-logger's README asks).
2. ``trainer.fit`` with ``ModelCheckpoint(every_n_train_steps=CKPT_EVERY)`` (one-logger's
   patched ``save_checkpoint``: ``checkpoint_save_sync``, ``save_checkpoint_success``) and
   validation every ``VAL_EVERY`` steps (``validation_loop``). When resuming
   (``--resume``), Lightning's restore (``_CheckpointConnector.resume_start`` to
   ``resume_end``, a private API of Lightning 2.5.6: Lightning has no public hook around
   it) is wrapped in ``on_load_checkpoint_start/end`` (``checkpoint_load``).
3. ``--kill-at-step S``: at the end of step S the process SIGKILLs itself (a real kill -9 of
   this OS process: one-logger's open ``training_loop``/``application`` spans and the
   records its ``BatchSpanProcessor`` still queues are lost).

The driver's own truth goes to ``--truth`` as JSON lines, each written and fsync'd at once:
``{"ev": ..., "t_ns": ...}`` for ``process_start``, ``step_start``/``step_end`` (``step``:
the global step after it), ``save_start``/``save_end`` (``step``), ``restore_start``/
``restore_end`` and ``killed`` (just before the SIGKILL).

Exporters: ``--out FILE`` writes OTLP JSON lines (the Collector's file exporter format: one
``ExportTraceServiceRequest`` per line, ids as hex, enums as integers); ``--endpoint URL``
exports live with the OTLP exporter (``http://host:port`` for gRPC, or ``--http`` for
OTLP/HTTP protobuf to ``URL/v1/traces``). The job is ``OTEL_SERVICE_NAME`` (one-logger's
``TracerProvider`` reads it) plus one-logger's ``session_tag`` (``--session``).

Exit status 0 when training finished; a killed run never returns.
"""

from __future__ import annotations

import time

T0_NS = time.time_ns()  # the script's start, before the heavy imports (truth: process_start)

import argparse  # noqa: E402
import base64  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from google.protobuf.json_format import MessageToDict  # noqa: E402
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402
from nv_one_logger.api.config import OneLoggerConfig  # noqa: E402
from nv_one_logger.otel.exporter.otel_exporter import OTelExporter  # noqa: E402
from nv_one_logger.training_telemetry.api import callbacks as ol  # noqa: E402
from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig  # noqa: E402
from nv_one_logger.training_telemetry.api.training_telemetry_provider import (  # noqa: E402
    TrainingTelemetryProvider,
)
from nv_one_logger.training_telemetry.integration.pytorch_lightning import hook_trainer_cls  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

BATCH = 4


class Truth:
    """The driver's own record: JSON lines, each written and fsync'd before returning."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, ev: str, t_ns: int | None = None, **kw) -> None:
        line = json.dumps({"ev": ev, "t_ns": t_ns or time.time_ns(), "pid": os.getpid(), **kw})
        with self._lock:
            os.write(self._fd, (line + "\n").encode())
            os.fsync(self._fd)


class OtlpJsonLinesExporter(SpanExporter):
    """An OTel ``SpanExporter`` writing one OTLP JSON ``ExportTraceServiceRequest`` per
    export call, as the Collector's file exporter does (ids in hex, enums as integers)."""

    def __init__(self, path: str):
        self._f = open(path, "a", encoding="utf-8")

    @staticmethod
    def _hex_ids(doc: dict) -> dict:
        for rs in doc.get("resourceSpans", ()):
            for ss in rs.get("scopeSpans", ()):
                for s in ss.get("spans", ()):
                    for k in ("traceId", "spanId", "parentSpanId"):
                        if s.get(k):
                            s[k] = base64.b64decode(s[k]).hex()
                    for lk in s.get("links", ()):
                        for k in ("traceId", "spanId"):
                            if lk.get(k):
                                lk[k] = base64.b64decode(lk[k]).hex()
        return doc

    def export(self, spans):
        doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        self._f.write(json.dumps(self._hex_ids(doc), separators=(",", ":")) + "\n")
        self._f.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self._f.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class TinyModel(pl.LightningModule):
    """A linear regression; each training step also sleeps ``step_s`` (a stand-in for
    real compute, so that a step lasts long enough to be measured)."""

    def __init__(self, step_s: float):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.step_s = step_s

    def training_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(self.step_s)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(self.step_s / 2)
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return self.opt


class TruthCallback(Callback):
    """Writes step boundaries to the truth file; SIGKILLs the process at ``kill_at``."""

    def __init__(self, truth: Truth, kill_at: int | None):
        self.truth, self.kill_at = truth, kill_at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.truth.write("step_start", step=trainer.global_step + 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.truth.write("step_end", step=trainer.global_step)
        if self.kill_at is not None and trainer.global_step >= self.kill_at:
            self.truth.write("killed", step=trainer.global_step)
            os.kill(os.getpid(), signal.SIGKILL)


def make_trainer_cls(truth: Truth):
    class TruthTrainer(pl.Trainer):
        """``pl.Trainer`` whose ``save_checkpoint`` (which one-logger's hook wraps) writes
        the save's truth around Lightning's own save."""

        def save_checkpoint(self, filepath, weights_only=False, storage_options=None):
            truth.write("save_start", step=self.global_step)
            super().save_checkpoint(filepath, weights_only, storage_options)
            truth.write("save_end", step=self.global_step)

    return TruthTrainer


def _wrap_restore(trainer, truth: Truth) -> None:
    """Bracket Lightning's checkpoint restore (``resume_start`` .. ``resume_end``) with the
    truth and one-logger's ``on_load_checkpoint_start/end``."""
    conn = trainer._checkpoint_connector
    start, end = conn.resume_start, conn.resume_end
    state = {"open": False}

    def resume_start(checkpoint_path=None):
        if checkpoint_path and not state["open"]:
            state["open"] = True
            truth.write("restore_start")
            ol.on_load_checkpoint_start()
        return start(checkpoint_path)

    def resume_end():
        out = end()
        if state["open"]:
            ol.on_load_checkpoint_end()
            truth.write("restore_end", step=trainer.global_step)
            state["open"] = False
        return out

    conn.resume_start, conn.resume_end = resume_start, resume_end


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="OTLP JSON lines file (appended; {rank}: the RANK)")
    ap.add_argument("--endpoint", help="OTLP endpoint for live export")
    ap.add_argument("--http", action="store_true", help="OTLP/HTTP instead of gRPC")
    ap.add_argument("--truth", required=True)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--session", default="session-1")
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--val-every", type=int, default=15)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--step-s", type=float, default=0.05)
    ap.add_argument("--kill-at-step", type=int)
    ap.add_argument("--resume", help="checkpoint to resume from")
    a = ap.parse_args(argv)

    truth = Truth(a.truth)
    truth.write("process_start", t_ns=T0_NS)
    if a.endpoint and a.http:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter(endpoint=a.endpoint.rstrip("/") + "/v1/traces")
    elif a.endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter(endpoint=a.endpoint, insecure=True)
    else:
        span_exporter = OtlpJsonLinesExporter(a.out.format(rank=os.environ.get("RANK", "0")))

    config = OneLoggerConfig(
        application_name="tiny-lightning", session_tag_or_fn=a.session,
        world_size_or_fn=int(os.environ.get("WORLD_SIZE", "1")),
        telemetry_config=TrainingTelemetryConfig(
            perf_tag_or_fn="tiny", global_batch_size_or_fn=BATCH,
            log_every_n_train_iterations=a.log_every,
            train_iterations_target_or_fn=a.max_steps))
    provider = TrainingTelemetryProvider.instance()
    provider.with_base_config(config).with_exporter(OTelExporter(span_exporter))
    provider.configure_provider()

    truth.write("app_start")
    trainer_cls, cb = hook_trainer_cls(make_trainer_cls(truth), provider)  # on_app_start

    ol.on_distributed_init_start()
    torch.set_num_threads(1)
    pl.seed_everything(1234, verbose=False)
    ol.on_distributed_init_end()

    cb.on_model_init_start()
    model = TinyModel(a.step_s)
    cb.on_model_init_end()
    cb.on_dataloader_init_start()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 8, generator=g)
    ds = TensorDataset(x, x.sum(1, keepdim=True))
    train = DataLoader(ds, batch_size=BATCH)
    val = DataLoader(TensorDataset(x[:64], x[:64].sum(1, keepdim=True)), batch_size=BATCH)
    cb.on_dataloader_init_end()
    cb.on_optimizer_init_start()
    model.opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cb.on_optimizer_init_end()

    world = int(os.environ.get("WORLD_SIZE", "1"))  # under torchrun: DDP over gloo
    trainer = trainer_cls(
        accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto",
        max_steps=a.max_steps, max_epochs=1,
        val_check_interval=a.val_every, limit_val_batches=3, num_sanity_val_steps=0,
        enable_progress_bar=False, logger=False, enable_model_summary=False,
        callbacks=[TruthCallback(truth, a.kill_at_step),
                   ModelCheckpoint(dirpath=a.ckpt_dir, every_n_train_steps=a.ckpt_every,
                                   save_top_k=-1, filename="{step}")])
    _wrap_restore(trainer, truth)
    trainer.fit(model, train, val, ckpt_path=a.resume)
    cb.on_app_end()
    truth.write("app_end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
