"""Head training with Accelerate: ``setup -> train -> cleanup``, shared by every head type of the registry.

The head type (``heads.type``) comes from :mod:`specheads.registry`, which names how its heads are built, the
loss of one micro-batch and the held-out evaluation; this module owns everything else (processes, data, optimizer,
schedule, checkpoints, export). The loss is the method's ``train_step(context, batch) -> StepResult``
(:mod:`specheads.training.step`): the trainer hands it a typed :class:`StepContext` per micro-batch and reads back
the loss and the metrics; a method never sees the trainer's own state.

Medusa (:mod:`specheads.methods.medusa.train`): Medusa-1 freezes the base, which runs once per batch for all heads;
Medusa-2 (``lora.enabled``) trains peft LoRA adapters jointly with the heads under
``L = lm_w * L_LM + sum_k w0 * decay^k * schedule * L_k``. EAGLE (:mod:`specheads.methods.eagle.train`): the base is
frozen and in the loop; EAGLE-1 regresses features, EAGLE-3 unrolls the draft on its own outputs. Block drafters
(:mod:`specheads.methods.dflash.train`, DFlash and DSpark): the base is frozen and in the loop, each sequence's
sampled anchors are drafted as blocks in one forward. Draft-LM (:mod:`specheads.methods.draft_lm.train`): a small LM
built from the base's layers learns the base's next-token distribution (KL). Medusa-2's joint training is the one
method-specific part that lives here (its LoRA preparation, parameter groups and adapter save, under
``lora.enabled``).

Accelerate owns processes, devices, mixed precision, trackers and ``save_state``/``load_state``. A checkpoint is
written into a hidden temporary directory and renamed into place once complete, so a crash mid-write never leaves a
checkpoint that looks complete; the JSON files the trainer writes and the exported heads' files go through
:func:`specheads.heads.checkpoint.atomic_write`, while ``evals.jsonl`` is appended to, one line per evaluation, and
the LoRA adapter is written by peft's ``save_pretrained``. The last
step always checkpoints, and so does a run stopped by SIGINT (Ctrl-C) or SIGTERM, after finishing its current step;
``train.resume=auto`` continues from the newest checkpoint, and a rerun of a finished run changes nothing (raise
``train.steps`` to train further). Under FSDP
(``configs/accelerate/fsdp.yaml``) the frozen base is sharded across the processes and the heads are replicated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedType, set_seed
from tqdm.auto import tqdm

from specheads.heads.checkpoint import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    HeadCheckpointError,
    atomic_write,
    check_base,
    load_module_state,
    read_checkpoint,
)
from specheads.loading import load_causal_lm, load_tokenizer
from specheads.registry import HEAD_TYPES, HeadType
from specheads.training.config import ConfigError, DataConfig, RecipeConfig, config_from_dict
from specheads.training.data import build_dataset
from specheads.training.evaluate import heldout_lm_loss, simulated_tau
from specheads.training.features import CachedFeatures, collate_padded, rows_fingerprint, write_feature_cache
from specheads.training.optimizers import build_optimizer, build_scheduler
from specheads.training.step import StepContext, StepResult

CHECKPOINTS = "checkpoints"
RUN_CONFIG = "run_config.json"
TRAINER_STATE = "trainer_state.json"
FINAL_STATE = "final_state.json"
HEADS = "heads"
EVALS = "evals.jsonl"  # one line per held-out evaluation
BEST = "best"  # output.select=best: the heads of the best evaluation so far
BEST_RECORD = "best.json"
TRAINING_LENGTH = ("steps", "epochs")  # train.* keys that say how long a run is, not what it is


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
    # the method's train_step(context, batch) -> StepResult, resolved once per run (default: the head type's)
    train_step: Callable[[StepContext, dict[str, torch.Tensor]], StepResult] | None = None

    def __post_init__(self) -> None:
        if self.train_step is None:
            self.train_step = self.head_type.train_step_fn()


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
    run = setup(config)
    with _stop_on_signals(run):
        train_loop(run)
        _agree_on_stop(run, out_of_time=False)  # a signal that came during the last step's checkpoint
    if run.stop_signal is not None:
        _close(run)
        raise TrainingInterrupted(run.step, latest_checkpoint(run.output), run.stop_signal)
    return cleanup(run)


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


# ---------------------------------------------------------------------------------------------------- setup
def setup(config: RecipeConfig) -> Run:
    output = Path(config.output.dir)
    check_tracker(config.log.tracker)
    accelerator = _accelerator(config, output)
    set_seed(config.train.seed)
    _guard_output_dir(config, output, accelerator)
    tokenizer = load_tokenizer(config.model.tokenizer or config.model.base)
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    if fsdp:
        _check_fsdp_recipe(config, accelerator)
    # Under FSDP the base stays on the CPU until prepare: FSDP moves it to the GPU one shard at a time.
    device = "cpu" if fsdp else accelerator.device
    base = load_causal_lm(config.model.base, dtype=config.model.dtype, device=device)
    head_type = HEAD_TYPES[config.heads.type]
    with accelerator.main_process_first():
        data_config = dataclasses.replace(config.data, paths=expand_data_paths(config.data.paths))
        dataset = build_dataset(data_config, tokenizer).with_format("torch")
    heads = head_type.build_heads(base, config.heads, dataset)
    if config.train.init_from:
        init_heads(heads, config.train.init_from, base, config.heads.type)
        accelerator.print(f"heads initialised from {config.train.init_from}")
    base = _prepare_base(config, base)
    collate, rows = collate_trimmed, dataset
    if config.data.feature_cache:
        dataset, collate = _cached_features(config, accelerator, base, heads, dataset), collate_padded
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
    optimizer = build_optimizer(config.train, _param_groups(config, base, heads), heads)
    batches_per_epoch = math.ceil(len(dataloader) / accelerator.num_processes)  # per process, after prepare
    # An epoch's micro-batches left over after its last full accumulation make one more step (Accelerate syncs at the
    # end of the data loader): counted, or the last epoch would end early and never see its last rows.
    steps_per_epoch = math.ceil(batches_per_epoch / config.train.grad_accumulation)
    total_steps = config.train.steps or max(1, int(config.train.epochs * steps_per_epoch))
    scheduler = build_scheduler(config.train, optimizer, total_steps)
    # The scheduler stays unprepared: it steps once per optimizer step whatever the number of processes.
    if fsdp:  # the frozen base is sharded across the processes (bases that do not fit one GPU)
        base, heads, optimizer, dataloader = _prepare_fsdp(accelerator, base, heads, optimizer, dataloader)
    elif config.lora.enabled:
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
    )
    _resume(run)
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
    config: RecipeConfig, accelerator: Accelerator, base: torch.nn.Module, heads: torch.nn.Module, dataset: Any
) -> CachedFeatures:
    """The rows with the base's features from ``data.feature_cache``, written there first where missing (by the
    main process; the others wait and read it)."""
    if config.lora.enabled:
        raise ConfigError("data.feature_cache needs a frozen base; lora.enabled trains it (Medusa-2)")
    directory = Path(config.data.feature_cache).expanduser()
    layers = getattr(heads, "hidden_state_layers", ())
    if accelerator.is_main_process:
        accelerator.print(f"feature cache: {directory} (base hidden states {sorted({*layers})} and the final one)")
        write_feature_cache(base, dataset, layers, directory, rows_fingerprint(dataset), config.train.batch_size)
    accelerator.wait_for_everyone()
    return CachedFeatures(directory, rows=len(dataset))


def row_lengths(dataset: Any, chunk: int = 4096) -> list[int]:
    """The real (attended) length of every row of a tokenised dataset."""
    lengths: list[int] = []
    for start in range(0, len(dataset), chunk):
        mask = torch.as_tensor(dataset[start : start + chunk]["attention_mask"])
        lengths.extend(mask.sum(dim=1).tolist())
    return lengths


class LengthGroupedSampler(torch.utils.data.Sampler):
    """A shuffled order of rows in which every ``batch_size`` consecutive rows have similar lengths (the trainer
    gives the global batch: accelerate deals consecutive per-process batches of one step to the processes).

    Each epoch (:meth:`set_epoch`, seeded by ``seed + epoch``, so a resumed run replays it) the rows are shuffled,
    cut into groups of ``group_batches`` batches, sorted by length within each group and cut into batches; the
    batches are then shuffled, except a last short one, which stays last (a loader with ``drop_last`` drops it). The
    loader cuts a batch to its longest row (:func:`collate_trimmed`), so grouping spends the step on real tokens:
    transformers' ``group_by_length`` does the same.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int = 0, group_batches: int = 50) -> None:
        self.lengths, self.batch_size, self.seed, self.group = lengths, batch_size, seed, batch_size * group_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        batches = []
        for start in range(0, len(order), self.group):
            group = sorted(order[start : start + self.group], key=lambda index: -self.lengths[index])
            batches += [group[i : i + self.batch_size] for i in range(0, len(group), self.batch_size)]
        tail = [batches.pop()] if batches and len(batches[-1]) < self.batch_size else []
        shuffled = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()] + tail
        return iter([index for batch in shuffled for index in batch])


def collate_trimmed(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack rows into a batch and cut the columns that are padding in every row.

    Rows are right-padded to ``data.max_length``; chats are often much shorter, and every padded column would cost
    a base forward and the heads' work for nothing. Padding is masked out of attention and loss, and no real
    position attends to a later one, so cutting it changes no result.
    """
    batch = torch.utils.data.default_collate(rows)
    mask = batch.get("attention_mask")
    if mask is None or mask.dim() != 2 or mask.shape[1] == 0:
        return batch
    length = int(mask.any(dim=0).nonzero().max()) + 1 if mask.any() else mask.shape[1]
    if length == mask.shape[1]:
        return batch
    return {
        key: value[:, :length] if isinstance(value, torch.Tensor) and value.dim() >= 2 else value
        for key, value in batch.items()
    }


def _check_fsdp_recipe(config: RecipeConfig, accelerator: Accelerator) -> None:
    """What the FSDP path does not cover yet, refused before the base is loaded (rather than a hang or a bad export)."""
    version = accelerator.state.fsdp_plugin.fsdp_version
    if version != 1:
        raise ConfigError(f"fsdp_version {version}: specheads shards the base with FSDP1 (fsdp_version: 1)")
    if config.lora.enabled:
        raise ConfigError("lora.enabled under FSDP is not supported: use DDP (configs/accelerate/ddp.yaml)")
    if config.data.eval_paths or config.data.heldout_fraction > 0:
        # cleanup() evaluates on the main process alone; a sharded base forward needs every process (it would hang).
        raise ConfigError(
            "held-out evaluation is not supported under FSDP: set data.eval_paths=[] data.heldout_fraction=0 "
            "and measure the exported heads with `specheads bench` or `specheads calibrate`"
        )


def _prepare_fsdp(
    accelerator: Accelerator, base: torch.nn.Module, heads: torch.nn.Module, optimizer: Any, dataloader: Any
) -> tuple[torch.nn.Module, torch.nn.Module, Any, Any]:
    """Shard the frozen base across the processes (FULL_SHARD); keep the small heads whole on every process.

    accelerate applies one FSDP plugin to every model it prepares, so the plugin is adjusted per model (FSDP1):

    * heads first: they become accelerate's model 0, and FSDP checkpoints pair optimizer i with model i;
    * heads with NO_SHARD and no auto-wrap: whole heads on every process, as under DDP, which the export, the
      checksums and the heads' own reads of their parameters outside forward rely on;
    * ``use_orig_params``: the optimizer was built over the heads' own parameters, which FSDP then keeps (with
      flat parameters it would step tensors the model no longer uses); the base has no trainable parameters, so
      any setting suits it;
    * the base's embedding and lm_head are ignored (kept whole, moved by hand): the heads call them outside the
      base's forward, where FSDP leaves its parameters sharded;
    * no FSDP mixed-precision policy: the base keeps its loaded dtype and fp32 buffers (RoPE), the heads compute
      under accelerate's autocast with fp32 weights and gradients, as under DDP.
    """
    from torch.distributed.fsdp import ShardingStrategy

    plugin = accelerator.state.fsdp_plugin
    base_strategy, base_wrap = plugin.sharding_strategy, plugin.auto_wrap_policy
    plugin.use_orig_params, plugin.mixed_precision_policy = True, None
    plugin.sharding_strategy, plugin.auto_wrap_policy, plugin.ignored_modules = ShardingStrategy.NO_SHARD, None, None
    heads, optimizer, dataloader = accelerator.prepare(heads, optimizer, dataloader)
    shared = [base.get_input_embeddings(), base.get_output_embeddings()]
    shared = [module.to(accelerator.device) for module in shared if module is not None]
    plugin.sharding_strategy, plugin.auto_wrap_policy, plugin.ignored_modules = base_strategy, base_wrap, shared
    base = accelerator.prepare(base)
    return base, heads, optimizer, dataloader


def eval_data(config: DataConfig) -> DataConfig:
    """The data settings that read ``config.eval_paths``: all of their records (no held-out split, no ``limit``),
    screened as the training data is except for ``exclude_prompts``, the list that keeps training chats away from
    these very prompts. Source files (``format: code``) are chosen afresh: the training corpus's manifest (and the
    feature cache it defaults into) lists the training files, not these."""
    return dataclasses.replace(
        config,
        paths=expand_data_paths(config.eval_paths),
        heldout_fraction=0.0,
        limit=None,
        exclude_prompts=[],
        manifest=None,
        feature_cache=None,
    )


def expand_data_paths(paths: list[str]) -> list[str]:
    """Replace ``default-corpus:train`` / ``default-corpus:heldout`` by the embedded default model's corpus files."""
    expanded = []
    for path in paths:
        if path.startswith("default-corpus:"):
            from specheads.assets import corpus

            split = path.split(":", 1)[1]
            if split not in ("train", "heldout"):
                raise ConfigError(f"data path {path!r}: use default-corpus:train or default-corpus:heldout")
            loaded = corpus.load_corpus()
            expanded.extend(str(Path(loaded.root) / item.relpath) for item in getattr(loaded, split))
        else:
            expanded.append(path)
    return expanded


def check_tracker(tracker: str) -> None:
    """Refuse a ``log.tracker`` whose package is missing, before anything loads (Accelerate would only warn).

    Availability is Accelerate's own test (``accelerate.utils.is_<tracker>_available``), the one it applies itself.
    """
    if tracker == "none":
        return
    import accelerate.utils

    if not getattr(accelerate.utils, f"is_{tracker}_available")():
        raise ConfigError(f"log.tracker {tracker!r} needs the {tracker} package: pip install {tracker}")


def _accelerator(config: RecipeConfig, output: Path) -> Accelerator:
    tracker = None if config.log.tracker == "none" else config.log.tracker
    if tracker == "wandb" and not os.environ.get("WANDB_API_KEY"):
        os.environ.setdefault("WANDB_MODE", "offline")  # no key: log locally, sync later with `wandb sync`
    mixed = mixed_precision(config)
    # Accelerate keeps its mixed-precision setting in a process-wide singleton that refuses a change; a second run in
    # this process (a library user, a learning-curve script) may want another one. The process group is kept.
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),  # without it, CPU processes under `accelerate launch` train alone
        gradient_accumulation_steps=config.train.grad_accumulation,
        # Shuffling seeded by (seed, epoch): a resumed run sees exactly the batches an uninterrupted one would.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=config.train.seed),
        mixed_precision=mixed,
        log_with=tracker,
        project_dir=str(output),
    )
    if tracker is not None:
        accelerator.init_trackers(
            config.log.project,
            config=_flatten(config.to_dict()),
            init_kwargs={"wandb": {"name": config.log.run_name}} if tracker == "wandb" else {},
        )
    return accelerator


def mixed_precision(config: RecipeConfig) -> str:
    """Accelerate's ``mixed_precision`` for a recipe (``train.mixed_precision``; see its comment in the config).

    ``auto``: the base's reduced dtype on a GPU; ``bf16`` on a CPU when the base runs in bf16 (``model.dtype``) and
    the CPU has native bf16 products (measured on this project's CPU, an EAGLE-3-sized forward and backward over
    4,096 tokens: 1,729 ms in float32, 1,057 ms under bf16 autocast); ``no`` otherwise.
    """
    from specheads.loading import cpu_has_native_bf16

    wanted = config.train.mixed_precision
    if wanted != "auto":
        return wanted
    dtype = config.model.dtype
    if dtype == "auto":  # what loading will choose for this base (bf16 for a quantized GGUF on a bf16 CPU)
        from specheads import assets
        from specheads.loading import resolve_dtype

        resolved = resolve_dtype(
            assets.resolve(config.model.base), "auto", "cuda" if torch.cuda.is_available() else None
        )
        dtype = str(resolved).removeprefix("torch.")
    reduced = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, "no")
    if torch.cuda.is_available():
        return reduced
    return "bf16" if reduced == "bf16" and cpu_has_native_bf16() else "no"


def _prepare_base(config: RecipeConfig, base: torch.nn.Module) -> torch.nn.Module:
    base.requires_grad_(False)
    if not config.lora.enabled:
        return base.eval()
    from peft import LoraConfig, get_peft_model

    targets = config.lora.target_modules
    lora = LoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
        modules_to_save=None if not config.lora.include_lm_head else ["lm_head"],
    )
    return get_peft_model(base, lora)


def _param_groups(config: RecipeConfig, base: torch.nn.Module, heads: torch.nn.Module) -> list[dict[str, Any]]:
    head_lr = config.train.lr * (config.train.heads_lr_multiplier if config.lora.enabled else 1.0)
    groups = [{"params": [p for p in heads.parameters() if p.requires_grad], "lr": head_lr}]
    if config.lora.enabled:
        groups.append({"params": [p for p in base.parameters() if p.requires_grad], "lr": config.train.lr})
    return groups


# ---------------------------------------------------------------------------------------------------- the loop
def train_loop(run: Run) -> None:
    """Optimizer steps until ``total_steps``, a signal or ``train.max_minutes``.

    Checkpoints every ``output.save_every`` steps and always at the step where the loop stops, so a finished, timed-out
    or interrupted run can be resumed or extended from where it stopped.
    """
    config, accelerator = run.config, run.accelerator
    progress = tqdm(total=run.total_steps, initial=run.step, desc="train", disable=not accelerator.is_main_process)
    started, tokens, stopping = time.perf_counter(), 0, False
    models = (run.heads, run.base) if config.lora.enabled else (run.heads,)
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
        joint=config.lora if config.lora.enabled else None,
        log_metrics=log_metrics,
        base=run.base,
        heads=run.heads,
        accelerator=run.accelerator,
    )


def train_batch(run: Run, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """One micro-batch: the method's loss (``run.train_step`` with this micro-batch's :func:`step_context`),
    its backward and, at the end of an accumulation, the clipped optimizer step. Returns ``loss`` and the method's
    metrics (its costly ones only on steps that log, ``log.every`` and the last).

    Accumulation (``train.grad_accumulation`` = N): Accelerate's backward divides every micro-batch's loss by N, so a
    step of N micro-batches follows the gradient of the mean of their losses. An epoch's micro-batches left over
    after its last full accumulation (fewer than N) make a step of their own at the epoch's end, each loss still
    divided by N (the step's gradient is that of their summed losses over N: a missing micro-batch counts as a zero
    loss)."""
    log_metrics = (run.step + 1) % run.config.log.every == 0 or run.step + 1 == run.total_steps
    result = run.train_step(step_context(run, log_metrics), batch)
    loss = result.loss
    run.accelerator.backward(loss)
    if run.accelerator.sync_gradients:
        run.accelerator.clip_grad_norm_(
            [p for g in run.optimizer.param_groups for p in g["params"]], run.config.train.max_grad_norm
        )
    run.optimizer.step()  # the prepared optimizer skips the step while gradients accumulate
    if run.accelerator.sync_gradients:
        run.scheduler.step()
    run.optimizer.zero_grad()
    return {"loss": float(loss.detach()), **result.metrics}


# ---------------------------------------------------------------------------------------------------- checkpoints
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
    _count_seen(run)
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
        _write_json(temporary / TRAINER_STATE, state, indent=None)
        _write_json(temporary / RUN_CONFIG, run.config.to_dict())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temporary, final)
        for old in sorted(root.glob("step-*"))[: -run.config.output.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _count_seen(run: Run) -> None:
    """Add every process's tokens since the last checkpoint to the run's totals (collective: all ranks call it)."""
    pending = torch.tensor(run.pending, dtype=torch.long, device=run.accelerator.device)
    if run.accelerator.num_processes > 1:
        pending = run.accelerator.reduce(pending, reduction="sum")
    run.tokens_seen += int(pending[0])
    run.targets_seen += int(pending[1])
    run.pending = [0, 0]


def _write_json(path: Path, value: Any, indent: int | None = 2) -> None:
    text = json.dumps(value, indent=indent) + "\n"
    atomic_write(path, lambda temporary: temporary.write_text(text))


def heads_checksums(run: Run) -> list[float]:
    """A checksum of the heads' parameters on every process (they must agree: a desync shows here)."""
    heads = run.accelerator.unwrap_model(run.heads)
    local = torch.stack([p.detach().double().sum() for p in heads.parameters()]).sum()
    return run.accelerator.gather(local.reshape(1).to(run.accelerator.device)).tolist()


def latest_checkpoint(output: Path) -> Path | None:
    """The newest complete checkpoint (temporary directories are never considered)."""
    candidates = sorted(p for p in (output / CHECKPOINTS).glob("step-*") if (p / TRAINER_STATE).is_file())
    return candidates[-1] if candidates else None


def _resume(run: Run) -> None:
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


def _guard_output_dir(config: RecipeConfig, output: Path, accelerator: Accelerator) -> None:
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
        _write_json(recorded, config.to_dict())


def _has_results(output: Path) -> bool:
    """Whether a run left anything to protect: a checkpoint or exported heads."""
    return latest_checkpoint(output) is not None or (output / HEADS).exists() or (output / FINAL_STATE).exists()


def _check_not_past(output: Path, steps: int) -> None:
    """Refuse, before anything loads, a rerun shorter than the checkpoint it would resume (``_resume`` checks again)."""
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


# ---------------------------------------------------------------------------------------------------- cleanup
def cleanup(run: Run) -> Path:
    """Export the final heads (and the LoRA adapter) in the native format; close the trackers.

    ``final_state.json`` is written last: it marks the run finished (see :func:`finished_run`).
    """
    accelerator = run.accelerator
    accelerator.wait_for_everyone()
    target = run.output / HEADS
    checksums = heads_checksums(run)
    _count_seen(run)
    if accelerator.is_main_process:
        heads = accelerator.unwrap_model(run.heads)
        heads.save_pretrained(target)
        if run.config.lora.enabled:
            accelerator.unwrap_model(run.base).save_pretrained(str(target / "adapter"))
        _write_json(target / "recipe.json", run.config.to_dict())
        evaluation = evaluate(run, accelerator.unwrap_model(run.heads))
        if evaluation is not None:
            record = _evaluation_record(run, evaluation)
            with (run.output / EVALS).open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            if run.config.output.select == "best" and not _better_than_best(run, record):
                best = run.output / BEST
                kept = json.loads((best / BEST_RECORD).read_text())
                accelerator.print(
                    f"output.select=best: the heads of step {kept['step']} ({run.config.output.select_by} "
                    f"{_score(run, kept):.3f}) beat the last step's ({_score(run, record):.3f}); exporting them"
                )
                for name in (WEIGHTS_NAME, CONFIG_NAME):
                    atomic_write(target / name, lambda path, source=best / name: shutil.copyfile(source, path))
                evaluation, record = json.loads((best / "eval.json").read_text()), kept
            evaluation["selected"] = {"step": record["step"], "rule": run.config.output.select}
            if run.config.output.select == "best":
                evaluation["selected"]["by"] = run.config.output.select_by
            _write_json(target / "eval.json", evaluation)
            accelerator.print(
                "held-out agreement with the base's greedy token by head: "
                + ", ".join(f"{a:.3f}" for a in evaluation["agreement_with_base_greedy"])
            )
            if "simulated_tau" in evaluation:
                accelerator.print(
                    "simulated tau (held-out agreement through the tree cost model): "
                    + ", ".join(f"{name} {tau:.2f}" for name, tau in evaluation["simulated_tau"].items())
                )
            accelerator.log(
                {f"eval/head_{k}/agreement": a for k, a in enumerate(evaluation["agreement_with_base_greedy"])},
                step=run.step,
            )
        summary = {
            "step": run.step,
            "total_steps": run.total_steps,
            "tokens_seen": run.tokens_seen,
            "targets_seen": run.targets_seen,
            "world_size": accelerator.num_processes,
            "heads_checksum_by_rank": checksums,
        }
        _write_json(run.output / FINAL_STATE, summary, indent=None)
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


def periodic_evaluation(run: Run) -> dict[str, Any] | None:
    """Evaluate the heads now (main process; the others wait), append the result to ``evals.jsonl``, log it and, with
    ``output.select=best``, keep these heads in ``best/`` when they beat every earlier evaluation."""
    accelerator = run.accelerator
    result = None
    if accelerator.is_main_process:
        heads = accelerator.unwrap_model(run.heads)
        result = evaluate(run, heads)
        if result is not None:
            record = _evaluation_record(run, result)
            with (run.output / EVALS).open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            accelerator.log(_evaluation_metrics(record), step=run.step)
            if run.config.output.select == "best" and _better_than_best(run, record):
                _keep_best(run, heads, result, record)
    accelerator.wait_for_everyone()
    return result


def _evaluation_record(run: Run, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "step": run.step,
        "epoch": round(run.batches_seen / run.batches_per_epoch, 3),
        "tokens_seen": run.tokens_seen + run.pending[0] * run.accelerator.num_processes,
        "agreement_with_base_greedy": result["agreement_with_base_greedy"],
        "simulated_tau": result.get("simulated_tau"),
    }


def _evaluation_metrics(record: dict[str, Any]) -> dict[str, float]:
    metrics = {f"eval/head_{k}/agreement": a for k, a in enumerate(record["agreement_with_base_greedy"])}
    metrics.update({f"eval/tau_{name}": tau for name, tau in (record.get("simulated_tau") or {}).items()})
    return metrics


def _score(run: Run, record: dict[str, Any]) -> float:
    tau = record.get("simulated_tau") or {}
    return float(tau.get(run.config.output.select_by, -1.0))


def _better_than_best(run: Run, record: dict[str, Any]) -> bool:
    best = run.output / BEST / BEST_RECORD
    return not best.is_file() or _score(run, record) > _score(run, json.loads(best.read_text()))


def _keep_best(run: Run, heads: torch.nn.Module, result: dict[str, Any], record: dict[str, Any]) -> None:
    """Save ``heads`` as ``best/`` whole or not at all (a temporary folder renamed over the old one)."""
    target, staging = run.output / BEST, run.output / f".tmp-{BEST}"
    shutil.rmtree(staging, ignore_errors=True)
    heads.save_pretrained(staging)
    _write_json(staging / "eval.json", result)
    _write_json(staging / BEST_RECORD, record)
    previous = run.output / f".old-{BEST}"
    shutil.rmtree(previous, ignore_errors=True)
    if target.exists():
        os.replace(target, previous)
    os.replace(staging, target)
    shutil.rmtree(previous, ignore_errors=True)


def evaluate(run: Run, heads: torch.nn.Module) -> dict[str, Any] | None:
    """Held-out head agreement (``data.eval_paths`` or the ``data.heldout_fraction`` split); None without either."""
    config = run.config.data
    if not config.eval_paths and config.heldout_fraction <= 0:
        return None
    tokenizer = load_tokenizer(run.config.model.tokenizer or run.config.model.base)
    if config.eval_paths:
        dataset = build_dataset(eval_data(config), tokenizer)
    else:
        dataset = build_dataset(
            dataclasses.replace(config, paths=expand_data_paths(config.paths)), tokenizer, split="heldout"
        )
    loader = torch.utils.data.DataLoader(
        dataset.with_format("torch"), batch_size=run.config.train.batch_size, collate_fn=collate_trimmed
    )
    device = run.accelerator.device

    total = min(len(loader), config.eval_batches) if config.eval_batches else len(loader)

    def batches(desc: str = "evaluate") -> Any:
        bar = tqdm(loader, total=total, desc=desc, disable=not run.accelerator.is_main_process, leave=False)
        return ({key: value.to(device) for key, value in batch.items()} for batch in bar)

    base = run.accelerator.unwrap_model(run.base)
    was_training, base_was_training = heads.training, base.training
    heads.eval()
    base.eval()
    run.accelerator.print(f"held-out evaluation: {total} batches of {run.config.train.batch_size} rows")
    result = run.head_type.evaluate_fn()(base, heads, batches(), max_batches=config.eval_batches)
    if "agreement_by_rank" in result:
        result["simulated_tau"] = simulated_tau(result["agreement_by_rank"])
    if run.config.lora.enabled:  # what Medusa-2 costs the base: held-out loss with and without the adapter
        result["base_heldout_loss_fine_tuned"] = heldout_lm_loss(base, batches("base loss"), config.eval_batches)
        with base.disable_adapter():
            result["base_heldout_loss_original"] = heldout_lm_loss(
                base, batches("base loss, no adapter"), config.eval_batches
            )
    heads.train(was_training)
    base.train(base_was_training)
    return result


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = (
                value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
            )
    return flat
