"""One torchft 0.2.0 replica group (one process, group world size 1) training a tiny model
on CPU with gloo, in the style of torchft's own ``train_ddp.py``: ``Manager``, ``Optimizer``
(``OptimizerWrapper``), ``ProcessGroupGloo``, gradients averaged with
``Manager.allreduce``. Not torchft's ``DistributedDataParallel``: in 0.2.0 its comm hook
fails ``assert fut._fut`` (ddp.py:76) and kills the survivor when the all-reduce breaks
because a peer was killed, the very case this run is for.

Run with the tool venv's python (``venv.sh``) by ``run_torchft.py``; never imported by
the tests. Environment: ``REPLICA_GROUP_ID`` (0, 1, ...), ``TORCHFT_LIGHTHOUSE``,
``JOB_ID``, ``TORCHFT_USE_OTEL=true``, ``OTEL_EXPORTER_OTLP_ENDPOINT``; arguments:
``TRUTH_FILE STOP_FILE STEP_SLEEP_S``: it trains until the manager's step reaches the
number the driver writes into ``STOP_FILE`` (so that every replica, the restarted one
too, stops at the same step).

The driver's truth: one JSON line per event, written and fsync'd before the loop goes on:
``{"ev": "start", "t": ns, "pid", "replica"}`` once, then per step ``{"ev": "step",
"step": manager step before the commit, "quorum_id": after the quorum, "t0": ns before
zero_grad (start_quorum), "tq": ns after wait_quorum (quorum, reconfiguration and any heal
done), "t1": ns after the optimizer step (should_commit done), "commit": bool}``.
No CPU shim is needed: torchft 0.2.0 runs on CPU with gloo as it is.
"""

import json
import logging
import os
import sys
import time

T_START = time.time_ns()

from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torchft  # noqa: E402  (sets up the OTLP loggers when TORCHFT_USE_OTEL=true)
from torch import nn, optim  # noqa: E402
from torch.distributed import TCPStore  # noqa: E402
from torchft import Manager, Optimizer, ProcessGroupGloo  # noqa: E402


def main() -> None:
    truth_path, stop_file, sleep_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    rid = int(os.environ["REPLICA_GROUP_ID"])
    truth = open(truth_path, "a", encoding="utf-8")

    def write(rec: dict) -> None:
        truth.write(json.dumps(rec) + "\n")
        truth.flush()
        os.fsync(truth.fileno())

    write({"ev": "start", "t": T_START, "pid": os.getpid(), "replica": rid})
    # torchft's records go out only at INFO (the loggers default to WARNING)
    for name in ("torchft_quorums", "torchft_commits", "torchft_errors"):
        logging.getLogger(name).setLevel(logging.INFO)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    inner = optim.SGD(model.parameters(), lr=0.01)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_ddp_{rid}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=10),
    )
    opt = Optimizer(manager, inner)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    while True:
        try:
            with open(stop_file) as f:
                if manager.current_step() >= int(f.read()):
                    break
        except (OSError, ValueError):
            pass  # (not written yet)
        t0 = time.time_ns()
        opt.zero_grad()
        manager.wait_quorum()
        tq = time.time_ns()
        qid = manager._quorum_id
        step = manager.current_step()
        loss = nn.functional.cross_entropy(model(x), y)
        time.sleep(sleep_s)  # (the step's work, before the all-reduce)
        loss.backward()
        for w in [manager.allreduce(p.grad) for p in model.parameters()]:
            w.wait()
        opt.step()
        t1 = time.time_ns()
        write({"ev": "step", "step": step, "quorum_id": qid, "t0": t0, "tq": tq, "t1": t1,
               "commit": manager.current_step() > step})
    manager.shutdown(wait=False)
    torchft.otel.shutdown()


if __name__ == "__main__":
    main()
