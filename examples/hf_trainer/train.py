"""Train a tiny BERT classifier with the Hugging Face ``Trainer``, goodput recorded automatically.

The only goodput line is ``goodput.instrument()``: the Trainer instrumentor
then records training prep, steps, data loading, evaluation and checkpoint
saves and restores, with no callback or marker in this script. The model is a
two-layer BERT built from a config (no download) that classifies
scikit-learn's bundled 8x8 digits, each image read as 64 "tokens" (its pixel
intensities 0..16). Everything runs on the CPU in well under a minute.

Run it (from the repository root; ``pip install -e '.[examples]'`` or
``export PYTHONPATH=src:collectors:instrumentation``)::

    GOODPUT_RUN_DIR=runs/hf-digits python examples/hf_trainer/train.py --output-dir ckpt/hf-digits
    goodput report runs/hf-digits

A crash and a restart: ``--crash-at-step 50`` raises an exception at step 50
(after the checkpoints of steps 20 and 40); running the same command again
without it resumes from the newest checkpoint (``resume_from_checkpoint=True``)
as the next attempt of the same job, and the report shows the wasted progress
(steps 41-49 done twice) and the checkpoint restore::

    rm -rf runs/hf-digits ckpt/hf-digits
    GOODPUT_RUN_DIR=runs/hf-digits python examples/hf_trainer/train.py \\
        --output-dir ckpt/hf-digits --crash-at-step 50
    GOODPUT_RUN_DIR=runs/hf-digits python examples/hf_trainer/train.py --output-dir ckpt/hf-digits
    goodput report runs/hf-digits

The job name is ``GOODPUT_JOB_NAME`` (default here ``hf-digits``).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("GOODPUT_JOB_NAME", "hf-digits")  # read when recording starts

import goodput  # noqa: E402

goodput.instrument()  # the only goodput line: patches Trainer when transformers imports it


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="ckpt/hf-digits", help="Trainer checkpoint directory")
    p.add_argument("--max-steps", type=int, default=60, help="optimizer updates in all")
    p.add_argument("--eval-every", type=int, default=20, help="evaluate every N steps")
    p.add_argument("--save-every", type=int, default=20, help="save a checkpoint every N steps")
    p.add_argument("--batch-size", type=int, default=32, help="per-device train batch size")
    p.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--crash-at-step", type=int, default=0,
                   help="raise an exception at this step (0: never), to try a restart")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in ("max_steps", "eval_every", "save_every", "batch_size", "grad_accum", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


class Digits:
    """scikit-learn's digits as a map-style dataset of ``{"input_ids", "labels"}`` tensors."""

    def __init__(self, images, labels):
        import torch

        self.input_ids = torch.as_tensor(images, dtype=torch.long)  # (n, 64), values 0..16
        self.labels = torch.as_tensor(labels, dtype=torch.long)  # (n,), values 0..9

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}


def main(argv: list[str] | None = None) -> None:
    """Train (or resume) and print the final evaluation loss."""
    args = parse_args(argv)

    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers.trainer_utils import get_last_checkpoint

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    digits = load_digits()
    images = digits.data.astype(np.int64)  # (1797, 64)
    order = np.random.default_rng(args.seed).permutation(len(images))
    train_idx, eval_idx = order[:1500], order[1500:]
    train_ds = Digits(images[train_idx], digits.target[train_idx])
    eval_ds = Digits(images[eval_idx], digits.target[eval_idx])

    config = BertConfig(
        vocab_size=17, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, type_vocab_size=1, num_labels=10,
    )
    model = BertForSequenceClassification(config)

    class CrashAt(TrainerCallback):
        """Raise at step ``args.crash_at_step``: a stand-in for a real failure."""

        def on_step_end(self, targs, state, control, **kwargs):
            if state.global_step == args.crash_at_step:
                raise RuntimeError(f"simulated crash at step {state.global_step}")

    targs = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=100,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=2e-3,
        eval_strategy="steps",
        eval_steps=args.eval_every,
        save_strategy="steps",
        save_steps=args.save_every,
        save_total_limit=3,
        logging_steps=10,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=args.seed,
    )
    trainer = Trainer(
        model=model, args=targs, train_dataset=train_ds, eval_dataset=eval_ds,
        callbacks=[CrashAt()] if args.crash_at_step else None,
    )
    resume = os.path.isdir(args.output_dir) and get_last_checkpoint(args.output_dir) is not None
    result = trainer.train(resume_from_checkpoint=True if resume else None)
    print(f"trained to step {result.global_step}; resumed: {resume}", flush=True)


if __name__ == "__main__":
    main()
