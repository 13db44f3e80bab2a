"""What a training run carries between setup, the loop and cleanup (:class:`Run`), the names of the files it writes
in ``output.dir``, and :func:`write_json`, through which it writes its JSON files whole or not at all."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from specheads.heads.checkpoint import atomic_write
from specheads.registry import HeadType
from specheads.training.config import RecipeConfig
from specheads.training.step import JointTraining, StepContext, StepResult

CHECKPOINTS = "checkpoints"
RUN_CONFIG = "run_config.json"
TRAINER_STATE = "trainer_state.json"
FINAL_STATE = "final_state.json"
HEADS = "heads"
EVALS = "evals.jsonl"  # one line per held-out evaluation
BEST = "best"  # output.select=best: the heads of the best evaluation so far
BEST_RECORD = "best.json"
TRAINING_LENGTH = ("steps", "epochs")  # train.* keys that say how long a run is, not what it is


@dataclass
class Run:
    """Everything ``train`` carries between setup, the loop and cleanup."""

    config: RecipeConfig
    accelerator: Accelerator
    base: torch.nn.Module
    heads: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    dataloader: Any
    total_steps: int
    batches_per_epoch: int
    output: Path
    head_type: HeadType
    step: int = 0  # optimizer steps done
    batches_seen: int = 0  # micro-batches consumed on each process (decides the epoch and the resume position)
    stop_signal: int | None = None  # SIGINT/SIGTERM received: stop after the current optimizer step
    tokens_seen: int = 0  # real (unpadded) tokens of every micro-batch of every process, up to the last checkpoint
    targets_seen: int = 0  # of which training targets (loss_mask)
    pending: list[int] = field(default_factory=lambda: [0, 0])  # this process's tokens / targets since then
    step_weight: float = 0.0  # this process's targets (StepResult.weight) in the optimizer step being accumulated
    # the method's train_step(context, batch) -> StepResult, resolved once per run (default: the head type's)
    train_step: Callable[[StepContext, dict[str, torch.Tensor]], StepResult] | None = None
    joint: JointTraining | None = None  # the method's hooks when the base trains jointly with the heads

    def __post_init__(self) -> None:
        if self.train_step is None:
            self.train_step = self.head_type.train_step_fn()


def write_json(path: Path, value: Any, indent: int | None = 2) -> None:
    text = json.dumps(value, indent=indent) + "\n"
    atomic_write(path, lambda temporary: temporary.write_text(text))
