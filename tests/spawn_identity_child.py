"""Child of ``tests/recorder/test_identity_and_warnings.py``: a real
``torch.multiprocessing.spawn`` job (no ``RANK`` variable), 2 ranks on gloo/CPU.

    python tests/spawn_identity_child.py RUN_DIR PORT MODE

MODE ``before``: each rank calls ``goodput.configure()`` before ``init_process_group`` (the
rank is learned later, by the recorder's background thread); ``after``: after it (the rank
is known at ``configure``). Each rank then records 6 steps with an all-reduce each and
exits normally.
"""

from __future__ import annotations

import os
import sys
import time

STEPS = 6


def worker(rank: int, world: int, run_dir: str, port: int, mode: str) -> None:
    import torch
    import torch.distributed as dist

    import goodput

    assert "RANK" not in os.environ
    if mode == "before":
        goodput.configure("spawn-identity", run_dir=run_dir, flush_interval_s=0.05)
        with goodput.training_prep():
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
        goodput.configure("spawn-identity", run_dir=run_dir, flush_interval_s=0.05)
    t = torch.ones(4)
    for i in range(STEPS):
        with goodput.step(i):
            dist.all_reduce(t)
            time.sleep(0.03)
    dist.barrier()
    goodput.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    run_dir, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    mp.spawn(worker, args=(2, run_dir, port, mode), nprocs=2, join=True)
    print("END")
