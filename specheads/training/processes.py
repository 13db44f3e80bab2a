"""Accelerate for a run: the accelerator (processes, mixed precision, trackers, seeded shuffling), the tracker check
made before anything loads, and the FSDP path (what it refuses, the frozen base sharded and the heads kept whole).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration

from specheads.training.config import ConfigError, RecipeConfig
from specheads.training.step import JointTraining


def check_tracker(tracker: str) -> None:
    """Refuse a ``log.tracker`` whose package is missing, before anything loads (Accelerate would only warn).

    Availability is Accelerate's own test (``accelerate.utils.is_<tracker>_available``), the one it applies itself.
    """
    if tracker == "none":
        return
    import accelerate.utils

    if not getattr(accelerate.utils, f"is_{tracker}_available")():
        raise ConfigError(f"log.tracker {tracker!r} needs the {tracker} package: pip install {tracker}")


def accelerator_for(config: RecipeConfig, output: Path) -> Accelerator:
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


def check_fsdp_recipe(config: RecipeConfig, accelerator: Accelerator, joint: JointTraining | None = None) -> None:
    """What the FSDP path does not cover yet, refused before the base is loaded (rather than a hang or a bad export)."""
    version = accelerator.state.fsdp_plugin.fsdp_version
    if version != 1:
        raise ConfigError(f"fsdp_version {version}: specheads shards the base with FSDP1 (fsdp_version: 1)")
    if joint is not None:
        raise ConfigError(f"{joint.setting} under FSDP is not supported: use DDP (configs/accelerate/ddp.yaml)")
    if config.data.eval_paths or config.data.heldout_fraction > 0:
        # cleanup() evaluates on the main process alone; a sharded base forward needs every process (it would hang).
        raise ConfigError(
            "held-out evaluation is not supported under FSDP: set data.eval_paths=[] data.heldout_fraction=0 "
            "and measure the exported heads with `specheads bench` or `specheads calibrate`"
        )


def prepare_fsdp(
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
