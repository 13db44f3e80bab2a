"""Head training with Accelerate: ``setup -> train -> cleanup``, shared by every head type.

The head type (``heads.type``) comes from :mod:`specheads.heads.registry`, which names how its heads are built, the
loss of one micro-batch and the held-out evaluation; this module owns everything else (processes, data, optimizer,
schedule, checkpoints, export). Medusa (:mod:`specheads.training.medusa`): Medusa-1 freezes the base, which runs once
per batch for all heads; Medusa-2 (``lora.enabled``) trains peft LoRA adapters jointly with the heads under
``L = lm_w * L_LM + sum_k w0 * decay^k * schedule * L_k``. EAGLE (:mod:`specheads.training.eagle`): the base is frozen
and in the loop; EAGLE-1 regresses features, EAGLE-3 unrolls the draft on its own outputs.

Accelerate owns processes, devices, mixed precision, trackers and ``save_state``/``load_state``. A checkpoint is
written into a hidden temporary directory and renamed into place once complete, so a crash mid-write never leaves a
checkpoint that looks complete; ``train.resume=auto`` continues from the newest one. Under FSDP
(``configs/accelerate/fsdp.yaml``) the frozen base is sharded across the processes and the heads are replicated.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedType, set_seed
from tqdm.auto import tqdm
from transformers import get_scheduler

from specheads.heads.registry import HEAD_TYPES, HeadType
from specheads.loading import load_causal_lm, load_tokenizer
from specheads.training.config import ConfigError, RecipeConfig
from specheads.training.data import build_dataset
from specheads.training.evaluate import heldout_lm_loss

CHECKPOINTS = "checkpoints"
RUN_CONFIG = "run_config.json"
TRAINER_STATE = "trainer_state.json"


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
    logging_step: bool = False  # this micro-batch's metrics are logged (head types skip costly metrics otherwise)


def train(config: RecipeConfig) -> Path:
    """Train heads as the recipe says; returns the directory of the exported heads."""
    run = setup(config)
    train_loop(run)
    return cleanup(run)


# ---------------------------------------------------------------------------------------------------- setup
def setup(config: RecipeConfig) -> Run:
    output = Path(config.output.dir)
    accelerator = _accelerator(config, output)
    set_seed(config.train.seed)
    _guard_output_dir(config, output, accelerator)
    tokenizer = load_tokenizer(config.model.tokenizer or config.model.base)
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    if fsdp:
        _check_fsdp_recipe(config, accelerator)
    # Under FSDP the base stays on the CPU until prepare: FSDP moves it to the GPU one shard at a time.
    device = "cpu" if fsdp else accelerator.device
    base = load_causal_lm(config.model.base, dtype=_dtype(config.model.dtype), device=device)
    head_type = HEAD_TYPES[config.heads.type]
    with accelerator.main_process_first():
        data_config = dataclasses.replace(config.data, paths=expand_data_paths(config.data.paths))
        dataset = build_dataset(data_config, tokenizer).with_format("torch")
    heads = head_type.build_heads(base, config.heads, dataset)
    base = _prepare_base(config, base)
    generator = torch.Generator().manual_seed(config.train.seed)
    dataloader = torch.utils.data.DataLoader(
        dataset, batch_size=config.train.batch_size, shuffle=True, drop_last=True, generator=generator
    )
    if len(dataloader) == 0:
        raise ConfigError(f"the data gives {len(dataset)} rows, fewer than one batch of {config.train.batch_size}")
    optimizer = torch.optim.AdamW(_param_groups(config, base, heads), weight_decay=config.train.weight_decay)
    batches_per_epoch = math.ceil(len(dataloader) / accelerator.num_processes)  # per process, after prepare
    total_steps = config.train.steps or max(
        1, int(config.train.epochs * batches_per_epoch / config.train.grad_accumulation)
    )
    scheduler = get_scheduler(
        config.train.schedule, optimizer, num_warmup_steps=config.train.warmup_steps, num_training_steps=total_steps
    )
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
    return run


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


def _accelerator(config: RecipeConfig, output: Path) -> Accelerator:
    tracker = None if config.log.tracker == "none" else config.log.tracker
    if tracker == "wandb" and not os.environ.get("WANDB_API_KEY"):
        os.environ.setdefault("WANDB_MODE", "offline")  # no key: log locally, sync later with `wandb sync`
    mixed = {"bfloat16": "bf16", "float16": "fp16"}.get(config.model.dtype, "no") if torch.cuda.is_available() else "no"
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


def _dtype(name: str) -> str | torch.dtype:
    return name if name == "auto" else getattr(torch, name)


# ---------------------------------------------------------------------------------------------------- the loop
def train_loop(run: Run) -> None:
    """Optimizer steps until ``total_steps``; checkpoints every ``output.save_every`` steps."""
    config, accelerator = run.config, run.accelerator
    progress = tqdm(total=run.total_steps, initial=run.step, desc="train", disable=not accelerator.is_main_process)
    started, tokens = time.perf_counter(), 0
    models = (run.heads, run.base) if config.lora.enabled else (run.heads,)
    while run.step < run.total_steps:
        epoch, consumed = divmod(run.batches_seen, run.batches_per_epoch)
        run.dataloader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(run.dataloader, consumed) if consumed else run.dataloader
        for batch in batches:
            with accelerator.accumulate(*models):
                metrics = _train_batch(run, batch)
            run.batches_seen += 1
            tokens += int(batch["attention_mask"].sum()) * accelerator.num_processes
            if not accelerator.sync_gradients:
                continue
            run.step += 1
            progress.update(1)
            progress.set_postfix(loss=f"{metrics['loss']:.3f}")
            if run.step % config.log.every == 0 or run.step == run.total_steps:
                metrics.update(
                    lr=run.scheduler.get_last_lr()[0], tokens_per_s=tokens / max(time.perf_counter() - started, 1e-9)
                )
                accelerator.log(metrics, step=run.step)
            if config.output.save_every and run.step % config.output.save_every == 0:
                save_checkpoint(run)
            if run.step >= run.total_steps or _out_of_time(run, started):
                break
        if _out_of_time(run, started):
            accelerator.print(f"train.max_minutes={config.train.max_minutes} reached at step {run.step}")
            if config.output.save_every:
                save_checkpoint(run)
            break
    progress.close()


def _out_of_time(run: Run, started: float) -> bool:
    limit = run.config.train.max_minutes
    if limit is None:
        return False
    # Every process must stop at the same step, so the main process decides and the others follow.
    flag = torch.tensor([float(time.perf_counter() - started > 60 * limit)], device=run.accelerator.device)
    return bool(run.accelerator.reduce(flag, reduction="max").item())


def _train_batch(run: Run, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    run.logging_step = (run.step + 1) % run.config.log.every == 0 or run.step + 1 == run.total_steps
    loss, head_metrics = run.head_type.train_step_fn()(run, batch)
    run.accelerator.backward(loss)
    if run.accelerator.sync_gradients:
        run.accelerator.clip_grad_norm_(
            [p for g in run.optimizer.param_groups for p in g["params"]], run.config.train.max_grad_norm
        )
    run.optimizer.step()  # the prepared optimizer skips the step while gradients accumulate
    if run.accelerator.sync_gradients:
        run.scheduler.step()
    run.optimizer.zero_grad()
    return {"loss": float(loss.detach()), **head_metrics}


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
    if accelerator.is_main_process:
        state = {
            "step": run.step,
            "batches_seen": run.batches_seen,
            "scheduler": run.scheduler.state_dict(),
            "world_size": accelerator.num_processes,
            "heads_checksum_by_rank": checksums,
        }
        (temporary / TRAINER_STATE).write_text(json.dumps(state) + "\n")
        (temporary / RUN_CONFIG).write_text(json.dumps(run.config.to_dict(), indent=2) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temporary, final)
        for old in sorted(root.glob("step-*"))[: -run.config.output.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


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
    run.accelerator.load_state(str(checkpoint))
    state = json.loads((checkpoint / TRAINER_STATE).read_text())
    run.step, run.batches_seen = state["step"], state["batches_seen"]
    run.scheduler.load_state_dict(state["scheduler"])
    run.accelerator.print(f"resumed from {checkpoint} at step {run.step}")


def _guard_output_dir(config: RecipeConfig, output: Path, accelerator: Accelerator) -> None:
    """Refuse an output directory that holds another run (or checkpoints not to resume), unless told to overwrite."""
    recorded = output / RUN_CONFIG
    conflict = None
    if recorded.is_file():
        if _run_identity(json.loads(recorded.read_text())) != _run_identity(config.to_dict()):
            conflict = f"{output} holds a different run (its {RUN_CONFIG} differs); choose another output.dir"
        elif config.train.resume == "never" and latest_checkpoint(output) is not None:
            conflict = f"{output} holds checkpoints and train.resume=never; set train.resume=auto to continue"
    if conflict and not config.train.overwrite:
        raise ConfigError(f"{conflict} or set train.overwrite=true to start over")
    if conflict and accelerator.is_main_process:
        shutil.rmtree(output / CHECKPOINTS, ignore_errors=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        output.mkdir(parents=True, exist_ok=True)
        recorded.write_text(json.dumps(config.to_dict(), indent=2) + "\n")


def _run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """The parts of a recipe that define a run (how often it logs or saves, or whether it resumes, do not)."""
    identity = json.loads(json.dumps(config))
    identity.get("train", {}).pop("resume", None)
    identity.get("train", {}).pop("overwrite", None)
    identity.get("train", {}).pop("max_minutes", None)
    identity.pop("log", None)
    identity.get("output", {}).pop("save_every", None)
    identity.get("output", {}).pop("keep_last", None)
    return identity


# ---------------------------------------------------------------------------------------------------- cleanup
def cleanup(run: Run) -> Path:
    """Export the final heads (and the LoRA adapter) in the native format; close the trackers."""
    accelerator = run.accelerator
    accelerator.wait_for_everyone()
    target = run.output / "heads"
    checksums = heads_checksums(run)
    if accelerator.is_main_process:
        summary = {"step": run.step, "world_size": accelerator.num_processes, "heads_checksum_by_rank": checksums}
        (run.output / "final_state.json").write_text(json.dumps(summary) + "\n")
        heads = accelerator.unwrap_model(run.heads)
        heads.save_pretrained(target)
        if run.config.lora.enabled:
            accelerator.unwrap_model(run.base).save_pretrained(str(target / "adapter"))
        (target / "recipe.json").write_text(json.dumps(run.config.to_dict(), indent=2) + "\n")
        evaluation = evaluate(run, accelerator.unwrap_model(run.heads))
        if evaluation is not None:
            (target / "eval.json").write_text(json.dumps(evaluation, indent=2) + "\n")
            accelerator.print(
                "held-out agreement with the base's greedy token by head: "
                + ", ".join(f"{a:.3f}" for a in evaluation["agreement_with_base_greedy"])
            )
            accelerator.log(
                {f"eval/head_{k}/agreement": a for k, a in enumerate(evaluation["agreement_with_base_greedy"])},
                step=run.step,
            )
    accelerator.wait_for_everyone()
    _release_wrappers(run)
    accelerator.end_training()
    return target


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


def evaluate(run: Run, heads: torch.nn.Module) -> dict[str, Any] | None:
    """Held-out head agreement (``data.eval_paths`` or the ``data.heldout_fraction`` split); None without either."""
    config = run.config.data
    if not config.eval_paths and config.heldout_fraction <= 0:
        return None
    tokenizer = load_tokenizer(run.config.model.tokenizer or run.config.model.base)
    if config.eval_paths:
        eval_config = dataclasses.replace(config, paths=expand_data_paths(config.eval_paths), heldout_fraction=0.0)
        dataset = build_dataset(eval_config, tokenizer)
    else:
        dataset = build_dataset(
            dataclasses.replace(config, paths=expand_data_paths(config.paths)), tokenizer, split="heldout"
        )
    loader = torch.utils.data.DataLoader(dataset.with_format("torch"), batch_size=run.config.train.batch_size)
    device = run.accelerator.device

    def batches() -> Any:
        return ({key: value.to(device) for key, value in batch.items()} for batch in loader)

    base = run.accelerator.unwrap_model(run.base)
    was_training, base_was_training = heads.training, base.training
    heads.eval()
    base.eval()
    result = run.head_type.evaluate_fn()(base, heads, batches(), max_batches=config.eval_batches)
    if run.config.lora.enabled:  # what Medusa-2 costs the base: held-out loss with and without the adapter
        result["base_heldout_loss_fine_tuned"] = heldout_lm_loss(base, batches(), config.eval_batches)
        with base.disable_adapter():
            result["base_heldout_loss_original"] = heldout_lm_loss(base, batches(), config.eval_batches)
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
