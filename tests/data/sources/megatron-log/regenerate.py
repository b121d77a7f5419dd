# ruff: noqa: UP032 - the format strings are copied verbatim from Megatron-LM
"""Regenerate ``trainer-0.previous.log``, ``trainer-0.log`` (+ ``truth.json``): a Megatron-LM
run's stdout as ``kubectl logs --timestamps --previous trainer-0`` and ``kubectl logs
--timestamps trainer-0`` show it: a launch that saves at iteration 50 and is killed after
iteration 73 (its last line: iteration 70), and the restarted container's launch, which
restores iteration 50 and runs to 100.

Why a generator and not Megatron itself: ``pretrain()`` and ``training_log`` need CUDA
(``training_log`` resets its loss accumulators with ``torch.tensor(..., device='cuda')``,
``print_datetime`` runs a ``torch.distributed.barrier()``, the timers gather on the
current CUDA device), so they cannot run on a CPU. Every line below is printed with the
format string copied verbatim from Megatron-LM main at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22), file and line named beside it; the
timeline (iteration times, save and load durations, the kill) is simulated with a fixed
seed, and ``truth.json`` holds it: what the importer must find. The RFC 3339 prefix is
what ``kubectl logs --timestamps`` adds (containerd's time of the line, ns).

Run: ``python tests/data/sources/megatron-log/regenerate.py`` (no arguments, about 0.1 s).
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = 1_796_000_000.0          # 2026-11-29 (s since the epoch), the first container's start
TRAIN_ITERS = 100
LOG_INTERVAL = 10
SAVE_AT = 50
KILL_AFTER = 73               # killed while iteration 74 runs (last line: iteration 70)
PRINT_DELAY = 0.0004          # s from a measurement to the line's arrival at the runtime


class Log:
    def __init__(self):
        self.lines: list[str] = []
        self.t = T0

    @staticmethod
    def _naive(t: float) -> str:
        # Megatron prints datetime.now() (the container's clock: UTC)
        return datetime.fromtimestamp(t, timezone.utc).strftime('%Y-%m-%d %H:%M:%S.%f')

    def out(self, t: float, text: str) -> None:
        """One stdout line, with the runtime's RFC 3339 nanosecond prefix."""
        ns = round(t * 1e9)
        stamp = datetime.fromtimestamp(ns // 10**9, timezone.utc).strftime('%Y-%m-%dT%H:%M:%S')
        for part in text.split("\n"):
            self.lines.append(f"{stamp}.{ns % 10**9:09d}Z {part}")

    # --- Megatron's own format strings (commit d98e8a64) -------------------------------

    def world_size(self, t):  # megatron/training/arguments.py:567
        self.out(t, 'using world size: {}, data-parallel size: {}, '
                 'context-parallel size: {}, '
                 'hierarchical context-parallel sizes: {}, '
                 'tensor-model-parallel size: {}, '
                 'pipeline-model-parallel size: {}'.format(8, 8, 1, None, 1, 1))

    def init_dist(self, t):  # megatron/training/initialize.py:286
        self.out(t, "> initializing torch distributed ...")

    def time_to_init(self, t, since):  # megatron/training/training.py:1741
        self.out(t, 'time to initialize megatron (seconds): {:.3f}'.format(t - since))

    def print_datetime(self, t, string):  # megatron/training/training.py:703
        time_str = self._naive(t)
        self.out(t + PRINT_DELAY, f'[{string}] datetime: {time_str} ')

    def loading(self, t, load_dir, iteration):  # megatron/training/checkpointing.py:2078
        dist_infix = 'distributed '
        self.out(t, f' loading {dist_infix}checkpoint from {load_dir} at iteration {iteration}')

    def loaded(self, t, load_dir, iteration):  # megatron/training/checkpointing.py:3159
        self.out(t, f'  successfully loaded checkpoint from {load_dir} '
                 f'[ t {1}/{1}, '
                 f'gtp_remat {1}/{1}, '
                 f'p {1}/{1} ] '
                 f'at iteration {iteration}')

    def timers(self, t, name, ms):  # megatron/core/timers.py:345 (log option minmax)
        output_string = '(min, max) time across ranks (ms):'
        output_string += '\n    {}: ({:.2f}, {:.2f})'.format((name + ' ').ljust(48, '.'),
                                                             ms * 0.98, ms)
        self.out(t, output_string)

    def saving(self, t, iteration, save_dir):  # megatron/training/checkpointing.py:693
        self.out(t, f'[{self._naive(t)}] saving checkpoint '
                 f'at iteration {iteration:7d} to {save_dir} in {"torch_dist"} format')

    def saved(self, t, iteration, save_dir):  # megatron/training/checkpointing.py:1085
        self.out(t, f'  [{self._naive(t)}] successfully saved '
                 f'checkpoint from iteration {int(iteration):7d} to {save_dir} '
                 f'[ t {1}/{1}, '
                 f'gtp_remat {1}/{1}, '
                 f'p {1}/{1} ]')

    def iteration(self, t, iteration, elapsed_time_per_iteration, consumed, lr, loss):
        # megatron/training/training.py:3567-3642 (no --log-throughput, no MoE, no energy)
        log_string = f" [{self._naive(t)}]"
        log_string += ' iteration {:8d}/{:8d} |'.format(iteration, TRAIN_ITERS)
        log_string += ' consumed samples: {:12d} |'.format(consumed)
        log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(
            elapsed_time_per_iteration * 1000.0
        )
        log_string += f' learning rate: {lr:.6E} |'
        log_string += f' global batch size: {256:5d} |'
        log_string += ' {}: {:.6E} |'.format('lm loss', loss)
        log_string += f' loss scale: {1.0:.1f} |'
        log_string += f' grad norm: {1.234:.3f} |'
        log_string += ' number of skipped iterations: {:3d} |'.format(0)
        log_string += ' number of nan iterations: {:3d} |'.format(0)
        self.out(t + PRINT_DELAY, log_string)


def launch(log: Log, rng: random.Random, truth: dict, start: float, resume: int | None,
           last: int) -> float:
    """One launch from its container's start to its last iteration ``last``; returns the
    time after it (the kill or the exit)."""
    att = {"start": start, "steps": [], "saves": [], "restore": None}
    log.out(start, "+ python pretrain_gpt.py --log-interval 10 --save-interval 50 ...")
    t = start + 4.2                          # imports of training.py begin
    import_t = t
    log.world_size(t + 1.1)
    log.init_dist(t + 1.3)
    t += 9.731                               # initialize_megatron
    log.time_to_init(t, import_t)
    log.print_datetime(t, 'after megatron is initialized')
    att["init_end"] = t
    t += 3.5
    if resume is not None:
        log.loading(t, '/ckpt/gpt', resume)
        load_s = 7.418
        log.loaded(t + load_s, '/ckpt/gpt', resume)
        att["restore"] = [t, t + load_s, resume]
        t += load_s
        log.timers(t + 0.01, 'load-checkpoint', load_s * 1000)
    t += 0.8
    log.print_datetime(t, 'after model, optimizer, and learning rate scheduler are built')
    t += 1.9
    log.print_datetime(t, 'after dataloaders are built')
    t += 0.05
    log.print_datetime(t, 'before the start of training step')
    att["prep_end"] = t
    it = resume or 0
    interval_start, interval_n = t, 0
    first = True
    seg_start = t
    while it < last:
        it += 1
        dt = (4.0 if first else 0.85) + rng.uniform(-0.03, 0.03)   # the first compiles
        t += dt
        interval_n += 1
        if it % LOG_INTERVAL == 0 or first:
            # training_log: elapsed of the interval-time timer / iterations in it; the
            # timer is not reset at the first iteration's line (should_reset=False)
            elapsed = t - interval_start
            steps_since = interval_n
            log.iteration(t, it, elapsed / steps_since, it * 256, 1.5e-4, 8.0 - it * 0.01)
            att["steps"].append([t - dt if first else seg_start, t, it,
                                 1 if first else it - att["steps"][-1][2]])
            seg_start = t
            if not first:
                interval_start, interval_n = t, 0
            first = False
        if it % SAVE_AT == 0:
            # save_checkpoint_and_time: the interval timer is stopped during the save
            s0 = t + 0.002
            log.saving(s0, it, '/ckpt/gpt')
            save_s = 12.5 + rng.uniform(0, 0.1)
            log.saved(s0 + save_s, it, '/ckpt/gpt')
            log.timers(s0 + save_s + 0.001, 'save-checkpoint', save_s * 1000)
            att["saves"].append([s0, s0 + save_s, it])
            pause = s0 + save_s + 0.003 - t
            t += pause
            interval_start += pause
            seg_start = t
    truth["attempts"].append(att)
    return t


def main() -> None:
    rng = random.Random(37)
    log = Log()
    truth: dict = {"attempts": [], "format": "Megatron-LM d98e8a64, simulated timeline"}
    t = launch(log, rng, truth, T0, None, KILL_AFTER)
    # iterations 71..73 ran, no line: killed while 74 runs; the last line is iteration 70's
    a0 = truth["attempts"][0]
    a0["last_line"] = a0["steps"][-1][1] + PRINT_DELAY
    kill = t + 0.4
    a0["kill"] = kill
    restart = kill + 31.25                   # the pod's restart (back-off, scheduling)
    first_container = len(log.lines)
    t = launch(log, rng, truth, restart, SAVE_AT, TRAIN_ITERS)
    log.print_datetime(t + 0.5, 'after training is done')
    truth["attempts"][1]["end"] = t + 0.5 + PRINT_DELAY
    (HERE / "trainer-0.previous.log").write_text("\n".join(log.lines[:first_container]) + "\n")
    (HERE / "trainer-0.log").write_text("\n".join(log.lines[first_container:]) + "\n")
    (HERE / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


if __name__ == "__main__":
    main()
