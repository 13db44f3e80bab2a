"""The recipe schema: typed dataclasses are the schema, YAML supplies values, ``key.sub=value`` overrides win.

Unknown keys are errors (with the known keys listed), so a typo never silently trains with a default.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A recipe that cannot be used: unknown key, wrong type, bad value, unreadable file."""


@dataclass
class ModelConfig:
    base: str = "default"  # local folder, hub id, or "default" (the embedded default model)
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    tokenizer: str | None = None  # default: the base's


@dataclass
class DataConfig:
    paths: list[str] = field(default_factory=list)  # files or folders; "sharegpt": the installed ShareGPT V3 file
    format: str = "text"  # sharegpt | text | jsonl | code (Python source files: specheads.training.code_corpus)
    max_length: int = 512
    text_field: str = "text"  # the field of jsonl records holding the text
    chat_template: str | None = None  # a Jinja template (or a file holding one) to use instead of the tokenizer's
    packing: bool = True  # text/jsonl: concatenate documents and cut into max_length windows
    limit: int | None = None  # use the first N records of the split (quick runs; the held-out split stays put)
    heldout_fraction: float = 0.0  # held out from training for evaluation, by record hash (code: by file path)
    eval_paths: list[str] = field(default_factory=list)  # held-out data evaluated after training (same format)
    eval_batches: int = 50  # at most this many batches of held-out data
    # A directory of the frozen base's features for the training rows, written on first use and reused across
    # epochs, runs and head types (see specheads.training.features); None: the base runs on every micro-batch.
    feature_cache: str | None = None
    # Records copying an evaluation prompt (MT-Bench, HumanEval, GSM8K when installed, the shipped prompt files and
    # exclude_prompts) are dropped with counts: see specheads.contamination. Off only for data known to be clean.
    decontaminate: bool = True
    exclude_prompts: list[str] = field(default_factory=list)  # more evaluation prompt files (JSONL) to keep out
    deduplicate: bool = True  # drop records identical to an earlier one (same text, or same conversation)
    # format code: the manifest of the files used (sha256, split, what was skipped), written on the first build and
    # read by every later one, so the file list stays fixed; None: data_files.json in feature_cache, if set
    manifest: str | None = None
    # Batches of rows of similar length (shuffled within groups of 50 batches, then the batches shuffled): a batch is
    # cut to its longest row, so chats of mixed lengths waste much of every step on padding otherwise
    group_by_length: bool = True
    num_proc: int = 2  # processes that tokenise (capped at the CPU count; a few hundred records stay in-process)
    cache: bool = True  # save the tokenised rows; a later build of the same files, tokenizer and settings loads them
    cache_dir: str | None = None  # where cached rows go (None: datasets' cache, HF_DATASETS_CACHE, + /specheads)


@dataclass
class TrainConfig:
    lr: float = 1e-3
    heads_lr_multiplier: float = 4.0  # Medusa-2: heads learn faster than the LoRA adapters
    weight_decay: float = 0.0
    steps: int | None = None  # optimizer steps; when None, epochs decide. Raised, a finished run continues
    epochs: float = 1.0
    batch_size: int = 8  # per process, per micro-batch
    grad_accumulation: int = 1  # micro-batches per optimizer step, which follows the mean loss over all their targets
    warmup_steps: int = 0  # 0 with init_from: a continued run starts at the peak lr (no re-warm)
    # cosine | linear | constant | wsd (warmup-stable-decay: warmup, the peak lr, a linear decay to zero over the
    # last decay_fraction of the steps); see specheads.training.optimizers
    schedule: str = "cosine"
    decay_fraction: float = 0.2  # wsd: the share of the steps that decay
    # adamw | muon (speculators' split: torch.optim.Muon on the heads' 2-D hidden matrices at muon_lr_multiplier x lr
    # with muon_weight_decay, AdamW at lr on norms, biases, embeddings and lm_head)
    optimizer: str = "adamw"
    muon_lr_multiplier: float = 10.0
    muon_weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 0
    max_minutes: float | None = None  # stop (checkpoint + export) after this wall time; the schedule keeps `steps`
    resume: str = "auto"  # auto | never | a checkpoint directory
    # Heads to start from instead of a fresh initialisation (a native checkpoint of the same method, architecture
    # and base, e.g. an earlier run's OUTPUT/heads): training continues them on this recipe's data with a fresh
    # optimizer and schedule. EAGLE heads keep the checkpoint's draft vocabulary (their lm_head rows are its tokens)
    init_from: str | None = None
    overwrite: bool = False  # allow writing into an output directory that holds another run
    # The heads' forward and backward under autocast, fp32 master weights and optimizer state. auto: bf16 (fp16) when
    # the base runs in bf16 (fp16) on a GPU, or in bf16 on a CPU with native bf16 products; no: fp32 throughout
    mixed_precision: str = "auto"  # auto | no | bf16 | fp16


@dataclass
class LoraConfig:
    enabled: bool = False  # Medusa-2: train LoRA adapters on the base jointly with the heads
    r: int = 32
    alpha: int = 16
    dropout: float = 0.05
    target_modules: list[str] | str = "all-linear"
    include_lm_head: bool = False
    stage1_steps: int = 0  # heads only for these steps, then joint training
    lm_loss_weight: float = 1.0
    head_weight: float = 0.2  # w0: head k's loss weighs w0 * decay^k * schedule
    head_decay: float = 0.8
    head_weight_warmup_steps: int = 0  # the schedule factor ramps 0 -> 1 over these steps
    self_distillation: bool = False  # KL to the adapter-free base instead of the data's next tokens


@dataclass
class LogConfig:
    tracker: str = "none"  # wandb | tensorboard | none
    project: str = "specheads"
    run_name: str | None = None
    every: int = 10
    # Held-out evaluation every N optimizer steps (0: only after the last one); each appends a line (step, tokens,
    # epoch, agreement by depth, simulated tau) to OUTPUT/evals.jsonl and goes to the tracker
    eval_every: int = 0


@dataclass
class OutputConfig:
    dir: str = "runs/medusa"
    save_every: int = 100  # steps between checkpoints; the step a run ends or is stopped at always saves (0: only it)
    keep_last: int = 2
    # Which heads the run exports: "last" (the last step's) or "best" (of every held-out evaluation, log.eval_every and
    # the final one, those with the highest select_by: a simulated tau, "chain-3", "tree-6", "tree-16")
    select: str = "last"
    select_by: str = "tree-6"


@dataclass
class RecipeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    heads: Any = field(default_factory=lambda: heads_section({})())  # the method's own section, by heads.type
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    log: LogConfig = field(default_factory=LogConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def validate(self) -> None:
        """Check values that types alone do not catch."""
        choices = {
            "model.dtype": (self.model.dtype, {"auto", "float32", "bfloat16", "float16"}),
            "data.format": (self.data.format, {"sharegpt", "text", "jsonl", "code"}),
            "train.schedule": (self.train.schedule, {"cosine", "linear", "constant", "wsd"}),
            "train.optimizer": (self.train.optimizer, {"adamw", "muon"}),
            "train.mixed_precision": (self.train.mixed_precision, {"auto", "no", "bf16", "fp16"}),
            "log.tracker": (self.log.tracker, {"wandb", "tensorboard", "none"}),
            "output.select": (self.output.select, {"last", "best"}),
            "output.select_by": (self.output.select_by, {"chain-3", "tree-6", "tree-16"}),
        }
        for key, (value, allowed) in choices.items():
            if value not in allowed:
                raise ConfigError(f"{key} is {value!r}; choose one of {sorted(allowed)}")
        positive = {
            "data.max_length": self.data.max_length,
            "train.batch_size": self.train.batch_size,
            "train.grad_accumulation": self.train.grad_accumulation,
            "train.lr": self.train.lr,
            "train.muon_lr_multiplier": self.train.muon_lr_multiplier,
        }
        for key, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{key} must be > 0, got {value!r}")
        self.heads.validate()
        if self.lora.enabled:
            from specheads.registry import HEAD_TYPES

            joint = sorted(name for name, method in HEAD_TYPES.items() if method.joint_training)
            if self.heads.type not in joint:
                raise ConfigError(
                    f"lora.enabled (joint training of the base) is a Medusa-2 setting, for heads.type in {joint}; "
                    f"{self.heads.type!r} trains heads on a frozen base"
                )
        if self.log.eval_every < 0:
            raise ConfigError(f"log.eval_every must be >= 0, got {self.log.eval_every}")
        if (self.log.eval_every or self.output.select == "best") and not (
            self.data.eval_paths or self.data.heldout_fraction > 0
        ):
            raise ConfigError(
                "log.eval_every and output.select=best need held-out data: set data.heldout_fraction or data.eval_paths"
            )
        if self.output.select == "best" and self.lora.enabled:
            raise ConfigError("output.select=best keeps heads only; with lora.enabled the adapter is the last step's")
        self._validate_schedule_and_optimizer()
        if self.train.steps is not None and self.train.steps <= 0:
            raise ConfigError(f"train.steps must be > 0, got {self.train.steps}")
        if not self.data.paths:
            raise ConfigError("data.paths is empty: name at least one data file or folder")

    def _validate_schedule_and_optimizer(self) -> None:
        train = self.train
        if train.warmup_steps < 0:
            raise ConfigError(f"train.warmup_steps must be >= 0, got {train.warmup_steps}")
        if not 0 < train.decay_fraction <= 1:
            raise ConfigError(f"train.decay_fraction must be in (0, 1], got {train.decay_fraction}")
        if train.muon_weight_decay < 0:
            raise ConfigError(f"train.muon_weight_decay must be >= 0, got {train.muon_weight_decay}")
        if train.optimizer == "muon" and self.lora.enabled:
            raise ConfigError("train.optimizer=muon trains heads on a frozen base; lora.enabled trains the base too")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RecipeConfig:
    """Read a recipe YAML (optional) and apply ``key.sub=value`` overrides.

    Raises:
        ConfigError: unreadable YAML, unknown keys, values of the wrong type, or invalid values.
    """
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"recipe {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"recipe {path} is not valid YAML: {error}") from error
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {path} must be a mapping of sections")
    for override in overrides:
        _apply_override(data, override)
    config = _build(RecipeConfig, data, "")
    config.validate()
    return config


def config_from_dict(data: dict[str, Any]) -> RecipeConfig:
    """A recipe from its ``to_dict()`` form (a run's ``run_config.json``); settings it lacks take their defaults."""
    config = _build(RecipeConfig, json.loads(json.dumps(data)), "")
    config.validate()
    return config


def _apply_override(data: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key.sub=value")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    target = data
    for part in parts[:-1]:
        target = target.setdefault(part, {})
        if not isinstance(target, dict):
            raise ConfigError(f"override {override!r}: {part} is not a section")
    target[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None


def _build(cls: type, values: Any, prefix: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"section {prefix.rstrip('.') or 'root'} must be a mapping, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s) {[prefix + k for k in unknown]}; known in this section: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        if cls is RecipeConfig and name == "heads":
            kwargs[name] = _build(heads_section(value), value or {}, "heads.")
        elif dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value or {}, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(value, hint, f"{prefix}{name}")
    return cls(**kwargs)


def heads_section(values: Any) -> type:
    """The dataclass of the ``heads`` section, chosen by its ``type`` (see :mod:`specheads.registry`)."""
    from specheads.registry import HEAD_TYPES

    kind = values.get("type", "medusa") if isinstance(values, dict) else "medusa"
    if kind not in HEAD_TYPES:
        raise ConfigError(f"heads.type is {kind!r}; choose one of {sorted(HEAD_TYPES)}")
    return HEAD_TYPES[kind].recipe_section()


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against a simple type hint (int, float, str, bool, list[str], X | None)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _coerce(value, option, key)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0])
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        (item,) = typing.get_args(hint)
        return [_coerce(v, item, key) for v in value]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "2e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if value is False and key.endswith("mixed_precision"):  # YAML 1.1 reads a bare `no` as false
            return "no"
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    return value
