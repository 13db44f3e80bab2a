"""Head training with Accelerate: ``setup -> train -> cleanup``, shared by every head type of the registry.

The head type (``heads.type``) comes from :mod:`specheads.registry`, which names how its heads are built, the
loss of one micro-batch and the held-out evaluation; this module owns everything else (processes, data, optimizer,
schedule, checkpoints, export). The loss is the method's ``train_step(context, batch) -> StepResult``
(:mod:`specheads.training.step`): the trainer hands it a typed :class:`StepContext` per micro-batch and reads back
the loss, the metrics and the loss's weight (its targets: an optimizer step of several micro-batches follows the mean
over all their targets, see :func:`train_batch`); a method never sees the trainer's own state.

Medusa (:mod:`specheads.methods.medusa.train`): Medusa-1 freezes the base, which runs once per batch for all heads;
Medusa-2 trains the base jointly with the heads (:mod:`specheads.methods.medusa.joint`). EAGLE
(:mod:`specheads.methods.eagle.train`): the base is frozen and in the loop; EAGLE-1 regresses features, EAGLE-3
unrolls the draft on its own outputs. Block drafters
(:mod:`specheads.methods.dflash.train`, DFlash and DSpark): the base is frozen and in the loop, each sequence's
sampled anchors are drafted as blocks in one forward. Draft-LM (:mod:`specheads.methods.draft_lm.train`): a small LM
built from the base's layers learns the base's next-token distribution (KL). A method that can train the base
jointly with its heads names its hooks in its registry entry (``joint_training``, a
:class:`~specheads.training.step.JointTraining`): through them the trainer prepares the base, builds the optimizer's
parameter groups, measures the base with and without its changes and saves those changes, reading none of the
method's settings.

Accelerate owns processes, devices, mixed precision, trackers and ``save_state``/``load_state``. A checkpoint is
written into a hidden temporary directory and renamed into place once complete, so a crash mid-write never leaves a
checkpoint that looks complete; the JSON files the trainer writes and the exported heads' files go through
:func:`specheads.heads.checkpoint.atomic_write`, while ``evals.jsonl`` is appended to, one line per evaluation, and
what joint training changed of the base is written by its ``save`` hook. The last
step always checkpoints, and so does a run stopped by SIGINT (Ctrl-C) or SIGTERM, after finishing its current step;
``train.resume=auto`` continues from the newest checkpoint, and a rerun of a finished run changes nothing (raise
``train.steps`` to train further). Under FSDP
(``configs/accelerate/fsdp.yaml``) the frozen base is sharded across the processes and the heads are replicated.

Where the pieces live: the run's state and the names of its files in :mod:`specheads.training.run_state`; Accelerate
and the FSDP path in :mod:`specheads.training.processes`; batching in :mod:`specheads.training.batches`; checkpoints,
resuming and the output directory in :mod:`specheads.training.checkpoints`; held-out evaluation and
``output.select=best`` in :mod:`specheads.training.heldout`. This module keeps ``setup -> train -> cleanup``, the
loop and one micro-batch's step.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from tqdm.auto import tqdm

from specheads.heads.checkpoint import HeadCheckpointError, check_base, load_module_state, read_checkpoint
from specheads.heads.loading import ADAPTER_DIR
from specheads.loading import load_causal_lm, load_tokenizer
from specheads.registry import HEAD_TYPES
from specheads.training.batches import LengthGroupedSampler, collate_trimmed, row_lengths
from specheads.training.checkpoints import (
    count_seen,
    finished_run,
    guard_output_dir,
    heads_checksums,
    latest_checkpoint,
    resume_run,
    save_checkpoint,
)
from specheads.training.config import ConfigError, RecipeConfig
from specheads.training.data import build_dataset
from specheads.training.features import CachedFeatures, collate_padded, rows_fingerprint, write_feature_cache
from specheads.training.files import expand_data_paths
from specheads.training.heldout import final_evaluation, periodic_evaluation
from specheads.training.memory import return_freed_memory
from specheads.training.optimizers import build_optimizer, build_scheduler
from specheads.training.processes import accelerator_for, check_fsdp_recipe, check_tracker, prepare_fsdp
from specheads.training.run_state import BEST, EVALS, FINAL_STATE, HEADS, Run, write_json
from specheads.training.step import JointTraining, StepContext, StepResult


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by SIGINT or SIGTERM after a checkpoint was written; ``str()`` is the one-line message.

    A ``KeyboardInterrupt``, as Ctrl-C is anywhere in Python; ``exit_code`` is the shell's convention (128 + signal).
    """

    def __init__(self, step: int, checkpoint: Path | None, signal_number: int) -> None:
        self.step, self.checkpoint, self.signal_number = step, checkpoint, signal_number
        self.exit_code = 128 + signal_number
        where = f"checkpoint saved to {checkpoint}" if checkpoint else "no checkpoint"
        name = signal.Signals(signal_number).name
        super().__init__(f"interrupted by {name} at step {step}; {where}; run the same command again to resume")


def train(config: RecipeConfig) -> Path:
    """Train heads as the recipe says; returns the directory of the exported heads.

    A run that already finished in ``output.dir`` (same recipe, all its steps done) is left as it is and its heads
    directory returned; with ``train.steps`` raised it continues from its last checkpoint.

    Raises:
        ConfigError: a recipe or an output directory that cannot be used.
        TrainingInterrupted: SIGINT or SIGTERM arrived; the current step was finished and checkpointed.
    """
    finished = finished_run(config)
    if finished is not None:
        return finished
    return_freed_memory()  # a long run's freed blocks go back to the system (glibc): its memory stays flat
    run = setup(config)
    with _stop_on_signals(run):
        train_loop(run)
        _agree_on_stop(run, out_of_time=False)  # a signal that came during the last step's checkpoint
    if run.stop_signal is not None:
        _close(run)
        raise TrainingInterrupted(run.step, latest_checkpoint(run.output), run.stop_signal)
    return cleanup(run)


# ---------------------------------------------------------------------------------------------------- setup
def setup(config: RecipeConfig) -> Run:
    output = Path(config.output.dir)
    check_tracker(config.log.tracker)
    accelerator = accelerator_for(config, output)
    set_seed(config.train.seed)
    guard_output_dir(config, output, accelerator)
    tokenizer = load_tokenizer(config.model.tokenizer or config.model.base)
    head_type = HEAD_TYPES[config.heads.type]
    joint = head_type.joint_training_for(config)  # None: the base stays frozen
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    if fsdp:
        check_fsdp_recipe(config, accelerator, joint)
    # Under FSDP the base stays on the CPU until prepare: FSDP moves it to the GPU one shard at a time.
    device = "cpu" if fsdp else accelerator.device
    base = load_causal_lm(config.model.base, dtype=config.model.dtype, device=device)
    with accelerator.main_process_first():
        data_config = dataclasses.replace(config.data, paths=expand_data_paths(config.data.paths))
        dataset = build_dataset(data_config, tokenizer).with_format("torch")
    heads = head_type.build_heads(base, config.heads, dataset)
    if config.train.init_from:
        init_heads(heads, config.train.init_from, base, config.heads.type)
        accelerator.print(f"heads initialised from {config.train.init_from}")
    base = _prepare_base(base, joint)
    collate, rows = collate_trimmed, dataset
    if config.data.feature_cache:
        dataset, collate = _cached_features(config, accelerator, base, heads, dataset, joint), collate_padded
    if config.data.group_by_length:
        # Grouped by the global batch (every process's rows of one step), so that the rows of a step, and the heads
        # trained, are the same on any number of processes with the same global batch.
        global_batch = config.train.batch_size * accelerator.num_processes
        order = {"sampler": LengthGroupedSampler(row_lengths(rows), global_batch, config.train.seed)}
    else:
        order = {"shuffle": True, "generator": torch.Generator().manual_seed(config.train.seed)}
    dataloader = torch.utils.data.DataLoader(
        dataset, batch_size=config.train.batch_size, drop_last=True, collate_fn=collate, **order
    )
    if len(dataloader) == 0:
        raise ConfigError(f"the data gives {len(dataset)} rows, fewer than one batch of {config.train.batch_size}")
    optimizer = build_optimizer(config.train, _param_groups(config, base, heads, joint), heads)
    batches_per_epoch = math.ceil(len(dataloader) / accelerator.num_processes)  # per process, after prepare
    # An epoch's micro-batches left over after its last full accumulation make one more step (Accelerate syncs at the
    # end of the data loader): counted, or the last epoch would end early and never see its last rows.
    steps_per_epoch = math.ceil(batches_per_epoch / config.train.grad_accumulation)
    total_steps = config.train.steps or max(1, int(config.train.epochs * steps_per_epoch))
    scheduler = build_scheduler(config.train, optimizer, total_steps)
    # The scheduler stays unprepared: it steps once per optimizer step whatever the number of processes.
    if fsdp:  # the frozen base is sharded across the processes (bases that do not fit one GPU)
        base, heads, optimizer, dataloader = prepare_fsdp(accelerator, base, heads, optimizer, dataloader)
    elif joint is not None:  # the base trains too
        base, heads, optimizer, dataloader = accelerator.prepare(base, heads, optimizer, dataloader)
    else:
        heads, optimizer, dataloader = accelerator.prepare(heads, optimizer, dataloader)
    run = Run(
        config,
        accelerator,
        base,
        heads,
        optimizer,
        scheduler,
        dataloader,
        total_steps,
        batches_per_epoch,
        output,
        head_type,
        joint=joint,
    )
    resume_run(run)
    if run.step == 0 and accelerator.is_main_process:  # a fresh start: no evaluation of an earlier run counts
        shutil.rmtree(output / BEST, ignore_errors=True)
        (output / EVALS).unlink(missing_ok=True)
    return run


def init_heads(heads: torch.nn.Module, directory: str | Path, base: torch.nn.Module, head_type: str) -> None:
    """Load the weights (and buffers: an EAGLE draft vocabulary) of the native checkpoint ``directory`` into the
    freshly built ``heads`` (``train.init_from``).

    Raises:
        ConfigError: the checkpoint is unreadable, of another method, made for another base, or of another
            architecture than the recipe builds (the differing config fields are named).
    """
    where = f"train.init_from={directory}"
    try:
        recorded, tensors = read_checkpoint(directory)
        if recorded.get("head_type") != head_type:
            kind = recorded.get("head_type")
            raise HeadCheckpointError(f"{where} holds {kind!r} heads; this recipe trains {head_type!r}")
        check_base(recorded.get("base_model", {}), base, where)
        built = dataclasses.asdict(heads.config)
        # a setting added since the checkpoint was written counts at its default there (what those heads are)
        settings = dataclasses.fields(heads.config)
        recorded = {**{f.name: f.default for f in settings if f.default is not dataclasses.MISSING}, **recorded}
        differing = sorted(
            key
            for key in set(built) | set(recorded)
            if key not in ("base_model", "specheads_version", "head_type") and built.get(key) != recorded.get(key)
        )
        if differing:
            fields = ", ".join(f"{key}: {recorded.get(key)!r} there, {built.get(key)!r} here" for key in differing)
            raise HeadCheckpointError(f"{where} has another architecture than this recipe's heads ({fields})")
        load_module_state(heads, tensors, where)
    except HeadCheckpointError as error:
        raise ConfigError(str(error)) from error


def _cached_features(
    config: RecipeConfig,
    accelerator: Accelerator,
    base: torch.nn.Module,
    heads: torch.nn.Module,
    dataset: Any,
    joint: JointTraining | None,
) -> CachedFeatures:
    """The rows with the base's features from ``data.feature_cache``, written there first where missing (by the
    main process; the others wait and read it)."""
    if joint is not None:
        raise ConfigError(f"data.feature_cache needs a frozen base; {joint.setting} trains it")
    directory = Path(config.data.feature_cache).expanduser()
    layers = getattr(heads, "hidden_state_layers", ())
    if accelerator.is_main_process:
        accelerator.print(f"feature cache: {directory} (base hidden states {sorted({*layers})} and the final one)")
        write_feature_cache(base, dataset, layers, directory, rows_fingerprint(dataset), config.train.batch_size)
    accelerator.wait_for_everyone()
    return CachedFeatures(directory, rows=len(dataset))


def _prepare_base(base: torch.nn.Module, joint: JointTraining | None) -> torch.nn.Module:
    """The base frozen, in eval mode; under joint training, as the method's ``prepare`` hook makes it trainable."""
    base.requires_grad_(False)
    return base.eval() if joint is None else joint.prepare(base)


def _param_groups(
    config: RecipeConfig, base: torch.nn.Module, heads: torch.nn.Module, joint: JointTraining | None
) -> list[dict[str, Any]]:
    """The heads' trainable parameters at ``train.lr``; under joint training, the method's groups."""
    if joint is not None:
        return joint.param_groups(base, heads, config.train.lr)
    return [{"params": [p for p in heads.parameters() if p.requires_grad], "lr": config.train.lr}]


# ---------------------------------------------------------------------------------------------------- the loop
def train_loop(run: Run) -> None:
    """Optimizer steps until ``total_steps``, a signal or ``train.max_minutes``.

    Checkpoints every ``output.save_every`` steps and always at the step where the loop stops, so a finished, timed-out
    or interrupted run can be resumed or extended from where it stopped.
    """
    config, accelerator = run.config, run.accelerator
    progress = tqdm(total=run.total_steps, initial=run.step, desc="train", disable=not accelerator.is_main_process)
    started, tokens, stopping = time.perf_counter(), 0, False
    models = (run.heads, run.base) if run.joint is not None else (run.heads,)
    while run.step < run.total_steps and not stopping:
        epoch, consumed = divmod(run.batches_seen, run.batches_per_epoch)
        run.dataloader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(run.dataloader, consumed) if consumed else run.dataloader
        for batch in batches:
            with accelerator.accumulate(*models):
                metrics = train_batch(run, batch)
            run.batches_seen += 1
            real = int(batch["attention_mask"].sum())
            tokens += real * accelerator.num_processes
            run.pending[0] += real
            run.pending[1] += int((batch["loss_mask"] * batch["attention_mask"]).sum())
            if not accelerator.sync_gradients:
                continue  # a signal waits for the end of the optimizer step: its micro-batches are not saved apart
            run.step += 1
            progress.update(1)
            tokens_per_s = tokens / max(time.perf_counter() - started, 1e-9)
            progress.set_postfix(loss=f"{metrics['loss']:.3f}", tokens_per_s=f"{tokens_per_s:.0f}")
            if run.step % config.log.every == 0 or run.step == run.total_steps:
                metrics.update(lr=run.scheduler.get_last_lr()[0], tokens_per_s=tokens_per_s)
                accelerator.log(metrics, step=run.step)
            out_of_time = _agree_on_stop(run, out_of_time=_out_of_time(run, started))
            stopping = out_of_time or run.stop_signal is not None or run.step >= run.total_steps
            if config.log.eval_every and run.step % config.log.eval_every == 0 and run.step < run.total_steps:
                periodic_evaluation(run)
            if stopping or (config.output.save_every and run.step % config.output.save_every == 0):
                save_checkpoint(run)
            if stopping:
                if out_of_time:
                    accelerator.print(f"train.max_minutes={config.train.max_minutes} reached at step {run.step}")
                break
    progress.close()


def _out_of_time(run: Run, started: float) -> bool:
    limit = run.config.train.max_minutes
    return limit is not None and time.perf_counter() - started > 60 * limit


def _agree_on_stop(run: Run, out_of_time: bool) -> bool:
    """Whether any process is out of time; every process adopts the signal any process received.

    Every process must stop at the same step (checkpointing is collective), so under several processes the flags are
    reduced, one small all-reduce per optimizer step; a single process decides alone, with no device sync.
    """
    if run.accelerator.num_processes == 1:
        return out_of_time
    flags = torch.tensor([float(run.stop_signal or 0), float(out_of_time)], device=run.accelerator.device)
    stop_signal, out_of_time = run.accelerator.reduce(flags, reduction="max").tolist()
    run.stop_signal = int(stop_signal) or None
    return bool(out_of_time)


@contextmanager
def _stop_on_signals(run: Run) -> Iterator[None]:
    """SIGINT and SIGTERM set ``run.stop_signal``: the loop finishes the current step, checkpoints and stops.

    Repeated signals change nothing: launchers (``accelerate launch``, torchrun) forward the terminal's Ctrl-C to
    processes that already received it, and the checkpoint must still be written (SIGKILL stops at once; the last
    complete checkpoint stays). The previous handlers come back on exit. Python sets handlers in the main thread
    only: elsewhere the signals keep theirs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def request_stop(signal_number: int, frame: Any) -> None:
        if run.stop_signal is None:
            run.stop_signal = signal_number

    previous = {number: signal.signal(number, request_stop) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python


def step_context(run: Run, log_metrics: bool) -> StepContext:
    """What the method's training step reads of ``run`` for its next micro-batch (see :class:`StepContext`)."""
    config = run.config
    return StepContext(
        step=run.step,
        epoch=run.batches_seen // max(run.batches_per_epoch, 1),
        seed=config.train.seed,
        section=config.heads,
        joint=run.joint,
        log_metrics=log_metrics,
        base=run.base,
        heads=run.heads,
        accelerator=run.accelerator,
    )


def train_batch(run: Run, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """One micro-batch: the method's loss (``run.train_step`` with this micro-batch's :func:`step_context`),
    its backward and, at the end of an accumulation, the clipped optimizer step. Returns ``loss`` and the method's
    metrics (its costly ones only on steps that log, ``log.every`` and the last).

    Accumulation (``train.grad_accumulation`` = N) weighs targets, not micro-batches: an optimizer step follows the
    gradient of the mean loss over every target of its micro-batches, on every process, so that with length-grouped
    batches a short micro-batch weighs less than a long one. Each micro-batch's loss is the mean over its
    ``StepResult.weight`` targets; it is back-propagated times that weight, and at the end of the accumulation the
    summed gradients are divided by the targets of all the step's micro-batches (:func:`_average_over_targets`).
    Micro-batches of 10 and 100 targets thus step with the gradient of the mean over their 110 targets; the
    micro-batches left over after an epoch's last full accumulation (fewer than N) make a step of their own at the
    epoch's end, with the mean over their own targets. A step of one micro-batch on one process (N = 1) steps with
    its loss's own gradient, untouched."""
    log_metrics = (run.step + 1) % run.config.log.every == 0 or run.step + 1 == run.total_steps
    result = run.train_step(step_context(run, log_metrics), batch)
    loss = _weighted(run, result, batch)
    run.accelerator.backward(loss)
    if run.accelerator.sync_gradients:
        _average_over_targets(run)
        run.accelerator.clip_grad_norm_(
            [p for g in run.optimizer.param_groups for p in g["params"]], run.config.train.max_grad_norm
        )
    run.optimizer.step()  # the prepared optimizer skips the step while gradients accumulate
    if run.accelerator.sync_gradients:
        run.scheduler.step()
    run.optimizer.zero_grad()
    return {"loss": float(result.loss.detach()), **result.metrics}


def _weighs_targets(run: Run) -> bool:
    """Whether an optimizer step holds several micro-batches (accumulated, or on several processes)."""
    return run.accelerator.gradient_accumulation_steps * run.accelerator.num_processes > 1


def _weighted(run: Run, result: StepResult, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The micro-batch's loss times its targets (``result.weight``, by default its next-token targets), which are
    added to this process's targets of the step; the loss as it is when the step has no other micro-batch."""
    if not _weighs_targets(run):
        return result.loss
    weight = result.weight
    if weight is None:
        weight = (batch["loss_mask"] * batch["attention_mask"])[:, 1:].sum()
    weight = float(weight)
    run.step_weight += weight
    return result.loss * weight


def _average_over_targets(run: Run) -> None:
    """At the end of an accumulation, make the summed gradients those of the mean over the step's targets.

    The heads' gradients are then ``sum_i weight_i * grad(loss_i) / N`` on each process (Accelerate's backward
    divides by N), averaged over the P processes (DDP); times ``N * P / W``, with ``W`` the targets of the step's
    micro-batches on every process (one all-reduce of a number when P > 1), they are ``sum_i weight_i *
    grad(loss_i) / W``. A step without any target leaves its (zero) gradients as they are.
    """
    if not _weighs_targets(run):
        return
    accelerator = run.accelerator
    total = torch.tensor(run.step_weight, dtype=torch.float64, device=accelerator.device)
    if accelerator.num_processes > 1:
        total = accelerator.reduce(total, reduction="sum")
    run.step_weight = 0.0
    if float(total) > 0:
        scale = accelerator.gradient_accumulation_steps * accelerator.num_processes / float(total)
        for group in run.optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    parameter.grad.mul_(scale)


# ---------------------------------------------------------------------------------------------------- cleanup
def cleanup(run: Run) -> Path:
    """Export the final heads (and, under joint training, the base's changes in ``heads/adapter``) in the native
    format, evaluate them (:func:`~specheads.training.heldout.final_evaluation`); close the trackers.

    ``final_state.json`` is written last: it marks the run finished (see :func:`finished_run`).
    """
    accelerator = run.accelerator
    accelerator.wait_for_everyone()
    target = run.output / HEADS
    checksums = heads_checksums(run)
    count_seen(run)
    if accelerator.is_main_process:
        heads = accelerator.unwrap_model(run.heads)
        heads.save_pretrained(target)
        if run.joint is not None:
            run.joint.save(accelerator.unwrap_model(run.base), target / ADAPTER_DIR)
        write_json(target / "recipe.json", run.config.to_dict())
        final_evaluation(run, target)
        summary = {
            "step": run.step,
            "total_steps": run.total_steps,
            "tokens_seen": run.tokens_seen,
            "targets_seen": run.targets_seen,
            "world_size": accelerator.num_processes,
            "heads_checksum_by_rank": checksums,
        }
        write_json(run.output / FINAL_STATE, summary, indent=None)
    _close(run)
    return target


def _close(run: Run) -> None:
    run.accelerator.wait_for_everyone()
    _release_wrappers(run)
    run.accelerator.end_training()


def _release_wrappers(run: Run) -> None:
    """Free the DDP/FSDP wrappers while the process group still exists.

    A wrapper freed after ``end_training`` destroyed the group (when ``train`` returns) runs its reducer's destructor,
    which waits on a gloo thread that needs the interpreter lock the main thread holds: a hang at exit in about one
    2-process run in ten. Unwrapped modules keep everything the export and the caller need.
    """
    run.heads = run.accelerator.unwrap_model(run.heads)
    run.base = run.accelerator.unwrap_model(run.base)
    run.optimizer = run.dataloader = None
    run.accelerator.free_memory()  # drops accelerate's own references to the prepared objects
    gc.collect()
    run.accelerator.wait_for_everyone()
