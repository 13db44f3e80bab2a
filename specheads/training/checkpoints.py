"""A run's checkpoints and output directory: save, find and resume checkpoints; which directory a run may use; whether
a run already finished.

A checkpoint (:func:`save_checkpoint`) is Accelerate's ``save_state`` and the trainer's own state (the step, the
micro-batches consumed, the tokens seen, the scheduler, a checksum of the heads on every process), written into a
hidden temporary directory and renamed into place once complete, so a visible checkpoint is always complete; the
newest ``output.keep_last`` are kept. :func:`resume_run` continues from one as ``train.resume`` says.
:func:`guard_output_dir` refuses a directory that holds another run (or checkpoints not to resume) unless told to
overwrite, and records the recipe there; :func:`finished_run` finds a run that already finished, which is not trained
again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from specheads.heads.checkpoint import CONFIG_NAME
from specheads.training.config import ConfigError, RecipeConfig, config_from_dict
from specheads.training.run_state import (
    CHECKPOINTS,
    FINAL_STATE,
    HEADS,
    RUN_CONFIG,
    TRAINER_STATE,
    TRAINING_LENGTH,
    Run,
    write_json,
)


def finished_run(config: RecipeConfig) -> Path | None:
    """The exported heads of ``config``'s run if it already finished in ``output.dir``, else None.

    Finished: ``output.dir`` records the same recipe (the same length included: raising ``train.steps`` continues the
    run instead), its last export covered every step, and ``train.resume`` is ``auto``.
    """
    output = Path(config.output.dir)
    if config.train.resume != "auto" or not (output / HEADS / CONFIG_NAME).is_file():
        return None
    try:
        recorded = json.loads((output / RUN_CONFIG).read_text())
        final = json.loads((output / FINAL_STATE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    current = config.to_dict()
    if _run_identity(recorded) != _run_identity(current) or _length(recorded) != _length(current):
        return None
    total = final.get("total_steps", recorded.get("train", {}).get("steps"))  # older runs recorded no total_steps
    return output / HEADS if total is not None and final.get("step") == total else None


def save_checkpoint(run: Run) -> Path:
    """``save_state`` into ``.tmp-step-N``, then rename to ``step-N``: a visible checkpoint is always complete."""
    accelerator = run.accelerator
    root = run.output / CHECKPOINTS
    final, temporary = root / f"step-{run.step:08d}", root / f".tmp-step-{run.step:08d}"
    if accelerator.is_main_process:
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(temporary))
    checksums = heads_checksums(run)
    count_seen(run)
    if accelerator.is_main_process:
        state = {
            "step": run.step,
            "batches_seen": run.batches_seen,
            "tokens_seen": run.tokens_seen,
            "targets_seen": run.targets_seen,
            "scheduler": run.scheduler.state_dict(),
            "world_size": accelerator.num_processes,
            "heads_checksum_by_rank": checksums,
        }
        write_json(temporary / TRAINER_STATE, state, indent=None)
        write_json(temporary / RUN_CONFIG, run.config.to_dict())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temporary, final)
        for old in sorted(root.glob("step-*"))[: -run.config.output.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def count_seen(run: Run) -> None:
    """Add every process's tokens since the last checkpoint to the run's totals (collective: all ranks call it)."""
    pending = torch.tensor(run.pending, dtype=torch.long, device=run.accelerator.device)
    if run.accelerator.num_processes > 1:
        pending = run.accelerator.reduce(pending, reduction="sum")
    run.tokens_seen += int(pending[0])
    run.targets_seen += int(pending[1])
    run.pending = [0, 0]


def heads_checksums(run: Run) -> list[float]:
    """A checksum of the heads' parameters on every process (they must agree: a desync shows here)."""
    heads = run.accelerator.unwrap_model(run.heads)
    local = torch.stack([p.detach().double().sum() for p in heads.parameters()]).sum()
    return run.accelerator.gather(local.reshape(1).to(run.accelerator.device)).tolist()


def latest_checkpoint(output: Path) -> Path | None:
    """The newest complete checkpoint (temporary directories are never considered)."""
    candidates = sorted(p for p in (output / CHECKPOINTS).glob("step-*") if (p / TRAINER_STATE).is_file())
    return candidates[-1] if candidates else None


def resume_run(run: Run) -> None:
    resume = run.config.train.resume
    if resume == "never":
        return
    checkpoint = latest_checkpoint(run.output) if resume == "auto" else Path(resume)
    if checkpoint is None:
        return
    if not (checkpoint / TRAINER_STATE).is_file():
        raise ConfigError(f"train.resume={resume}: {checkpoint} is not a complete specheads checkpoint")
    state = json.loads((checkpoint / TRAINER_STATE).read_text())
    if state["step"] > run.total_steps:
        raise ConfigError(
            f"{checkpoint} is at step {state['step']}, past this recipe's {run.total_steps} steps: raise train.steps, "
            "choose another output.dir, or set train.resume=never train.overwrite=true to start over"
        )
    run.accelerator.load_state(str(checkpoint))
    run.step, run.batches_seen = state["step"], state["batches_seen"]
    run.tokens_seen, run.targets_seen = state.get("tokens_seen", 0), state.get("targets_seen", 0)
    run.scheduler.load_state_dict(state["scheduler"])
    run.accelerator.print(f"resumed from {checkpoint} at step {run.step}")


def guard_output_dir(config: RecipeConfig, output: Path, accelerator: Accelerator) -> None:
    """Refuse an output directory that holds another run (or checkpoints not to resume), unless told to overwrite.

    The same run with another length (``train.steps``, ``train.epochs``) is the same run: it continues. A recorded
    run that left nothing behind (it failed before its first checkpoint) never blocks the directory.
    """
    recorded = output / RUN_CONFIG
    conflict = None
    if recorded.is_file():
        previous = json.loads(recorded.read_text())
        if _run_identity(previous) != _run_identity(config.to_dict()):
            if _has_results(output):
                conflict = f"{output} holds a different run (its {RUN_CONFIG} differs); choose another output.dir"
        elif config.train.resume == "never" and latest_checkpoint(output) is not None:
            conflict = f"{output} holds checkpoints and train.resume=never; set train.resume=auto to continue"
        elif config.train.resume == "auto" and config.train.steps is not None:
            _check_not_past(output, config.train.steps)
    if conflict and not config.train.overwrite:
        raise ConfigError(f"{conflict} or set train.overwrite=true to start over")
    if conflict and accelerator.is_main_process:
        shutil.rmtree(output / CHECKPOINTS, ignore_errors=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        output.mkdir(parents=True, exist_ok=True)
        (output / FINAL_STATE).unlink(missing_ok=True)  # training again: finished only once exported again
        write_json(recorded, config.to_dict())


def _has_results(output: Path) -> bool:
    """Whether a run left anything to protect: a checkpoint or exported heads."""
    return latest_checkpoint(output) is not None or (output / HEADS).exists() or (output / FINAL_STATE).exists()


def _check_not_past(output: Path, steps: int) -> None:
    """Refuse, before anything loads, a rerun shorter than the checkpoint it would resume (:func:`resume_run`
    checks again)."""
    checkpoint = latest_checkpoint(output)
    if checkpoint is not None:
        done = json.loads((checkpoint / TRAINER_STATE).read_text())["step"]
        if done > steps:
            raise ConfigError(
                f"{output} already trained {done} steps, more than train.steps={steps}: raise train.steps, choose "
                "another output.dir, or set train.resume=never train.overwrite=true to start over"
            )


def _run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """The parts of a recipe that define a run: not its length, how often it logs or saves, or whether it resumes.

    A recorded recipe is read back through the config classes first, so a setting added since it was recorded counts
    at its default (which keeps the old behaviour) rather than making the run another one.
    """
    with contextlib.suppress(ConfigError, TypeError, ValueError):  # settings since removed: compared as recorded
        config = config_from_dict(config).to_dict()
    identity = json.loads(json.dumps(config))
    for key in ("resume", "overwrite", "max_minutes", *TRAINING_LENGTH):
        identity.get("train", {}).pop(key, None)
    identity.pop("log", None)
    identity.get("output", {}).pop("save_every", None)
    identity.get("output", {}).pop("keep_last", None)
    return identity


def _length(config: dict[str, Any]) -> dict[str, Any]:
    return {key: config.get("train", {}).get(key) for key in TRAINING_LENGTH}
