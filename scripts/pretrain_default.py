"""Pretrain the embedded default models of specheads on the Python standard library.

Three phases, each resumable and deterministic for a given seed:

    tokenizer  byte-level BPE (vocab 8192, ``<|endoftext|>``) trained on the train split only
    train      a base LlamaForCausalLM and a ~5-10x smaller draft, trained in one loop on the same batches
    export     transformers-loadable folders + manifest.json under ``specheads/assets/default``

The learning-rate schedule is planned in tokens (``--token-budget``), so stopping with ``--max-minutes`` and running
the same command again continues the same run. Checkpoints and logs live in ``--work-dir`` (outside git). A checkpoint
is safetensors (weights, optimiser moments, torch RNG states) plus JSON (plan, counters, history, optimiser settings,
Python and numpy RNG states), written with the library's atomic writer; nothing is pickled or unpickled. The losses are
the library's (``specheads.training``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# Checkpoints and token caches live outside git; SPECHEADS_PRETRAIN_DIR moves them.
DEFAULT_WORK_DIR = Path(os.environ.get("SPECHEADS_PRETRAIN_DIR", Path.home() / ".cache" / "specheads" / "pretrain"))
DEFAULT_ASSETS_DIR = REPO_ROOT / "specheads" / "assets" / "default"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("phase", choices=["tokenizer", "train", "export"])
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="checkpoints, caches and logs")
    p.add_argument("--assets-dir", type=Path, default=DEFAULT_ASSETS_DIR, help="export destination")
    p.add_argument(
        "--corpus-root",
        type=Path,
        default=None,
        help="a folder of .py files to use instead of this interpreter's standard library (tests)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16, help="windows per optimiser step")
    p.add_argument("--token-budget", type=int, default=12_000_000, help="planned training tokens (sets the schedule)")
    p.add_argument("--base-hidden", type=int, default=192)
    p.add_argument("--base-layers", type=int, default=6)
    p.add_argument("--base-heads", type=int, default=6)
    p.add_argument("--base-intermediate", type=int, default=512)
    p.add_argument("--draft-hidden", type=int, default=96)
    p.add_argument("--draft-layers", type=int, default=1)
    p.add_argument("--draft-heads", type=int, default=3)
    p.add_argument("--draft-intermediate", type=int, default=256)
    p.add_argument("--lr", type=float, default=1.5e-3, help="peak learning rate of the base")
    p.add_argument("--draft-lr", type=float, default=2e-3, help="peak learning rate of the draft")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-frac", type=float, default=0.04)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-minutes", type=float, default=None, help="stop cleanly (with a checkpoint) after this")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (testing)")
    p.add_argument("--ckpt-minutes", type=float, default=5.0)
    p.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations")
    p.add_argument("--eval-windows", type=int, default=32, help="held-out windows in the periodic evaluation")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument(
        "--allow-replan", action="store_true", help="resume even if --token-budget changed (reshapes the schedule)"
    )
    return p.parse_args(argv)


if __name__ == "__main__":  # --help and a usage error answer before the imports below load torch
    parse_args()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.insert(0, str(REPO_ROOT))  # the checkout's specheads when it is not installed
from specheads.assets import corpus as default_corpus  # noqa: E402
from specheads.heads.checkpoint import atomic_write  # noqa: E402
from specheads.training.evaluate import heldout_lm_loss  # noqa: E402
from specheads.training.losses import lm_loss  # noqa: E402

EOS = "<|endoftext|>"
MAX_ASSETS_BYTES = 25 * 1024 * 1024
# The models' max_position_embeddings, and the tokenizers' model_max_length, unless --seq-len is longer.
MIN_POSITIONS = 2048
CHECKPOINT_DIR = "checkpoint"  # under --work-dir: state.json + tensors-<step>.safetensors
CHECKPOINT_STATE = "state.json"
CHECKPOINT_FORMAT = 1
PICKLED_CHECKPOINT = "ckpt.pt"  # what versions before the safetensors checkpoint wrote; refused, never loaded
log = logging.getLogger("pretrain_default")


@dataclass(frozen=True)
class ModelSpec:
    """The size of one Llama model."""

    hidden: int
    layers: int
    heads: int
    intermediate: int


@dataclass(frozen=True)
class RunPlan:
    """Everything that fixes the training trajectory; a resumed run must match it exactly."""

    seed: int
    vocab_size: int
    seq_len: int
    batch_size: int
    token_budget: int
    base: ModelSpec
    draft: ModelSpec
    lr: float
    draft_lr: float
    min_lr_ratio: float
    warmup_frac: float
    weight_decay: float

    @property
    def tokens_per_step(self) -> int:
        """Training tokens (targets) per optimiser step."""
        return self.batch_size * self.seq_len

    @property
    def total_steps(self) -> int:
        """Optimiser steps in the planned budget."""
        return max(1, self.token_budget // self.tokens_per_step)


# --------------------------------------------------------------------------------------------------------------
# Setup helpers
# --------------------------------------------------------------------------------------------------------------


def setup_logging(work_dir: Path, phase: str) -> None:
    """Log to ``work_dir/<phase>.log`` (appending) and to stderr, and record the exact command line.

    Handlers of an earlier call in the same process are closed first, so each phase logs once, to its own file.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%SZ")
    fmt.converter = time.gmtime
    for handler in (logging.FileHandler(work_dir / f"{phase}.log"), logging.StreamHandler()):
        handler.setFormatter(fmt)
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    command = current_command()
    log.info("command: %s", command)
    with open(work_dir / "commands.jsonl", "a") as f:
        f.write(json.dumps({"time": utc_now(), "phase": phase, "command": command}) + "\n")


def current_command() -> str:
    """The command line of this process, as one shell-quoted string run from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_arg = str(script.relative_to(REPO_ROOT))
    except ValueError:
        script_arg = str(script)
    return shlex.join(["python", script_arg, *sys.argv[1:]])


def utc_now() -> str:
    """The current UTC time in ISO format, seconds precision."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file with the library's atomic writer (temporary file in the same folder, then rename)."""
    atomic_write(path, lambda temporary: temporary.write_text(text))


def atomic_save_npy(path: Path, array: np.ndarray) -> None:
    """``np.save`` an array with the library's atomic writer (through a file object: a path would gain ``.npy``)."""

    def write(temporary: Path) -> None:
        with open(temporary, "wb") as f:
            np.save(f, array)

    atomic_write(path, write)


def max_positions(seq_len: int) -> int:
    """The models' position limit, which the tokenizers also report as ``model_max_length``."""
    return max(MIN_POSITIONS, seq_len)


# --------------------------------------------------------------------------------------------------------------
# Phase 1: tokenizer
# --------------------------------------------------------------------------------------------------------------


def train_tokenizer(work_dir: Path, vocab_size: int, seq_len: int, corpus_root: Path | None = None) -> Path:
    """Train a byte-level BPE on the train split and save it as a transformers fast tokenizer.

    Args:
        work_dir: where the tokenizer folder goes.
        vocab_size: BPE vocabulary size, ``<|endoftext|>`` included.
        seq_len: training window; the tokenizer's ``model_max_length`` is ``max_positions(seq_len)``.
        corpus_root: a folder of ``.py`` files instead of the interpreter's standard library (tests).

    Returns:
        The folder ``work_dir/tokenizer`` that ``AutoTokenizer.from_pretrained`` loads offline.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = default_corpus.load_corpus(corpus_root)
    log.info("corpus: %s files, hash %s", corpus.counts(), corpus.corpus_hash)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tokenizer.train_from_iterator((f.text for f in corpus.train), trainer=trainer, length=len(corpus.train))
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=EOS,
        unk_token=EOS,
        model_max_length=max_positions(seq_len),
    )
    out_dir = work_dir / "tokenizer"
    wrapped.save_pretrained(out_dir)
    meta = {"corpus_hash": corpus.corpus_hash, "vocab_size": len(wrapped), "time": utc_now()}
    atomic_write_text(out_dir / "specheads_tokenizer_meta.json", json.dumps(meta, indent=2))
    log.info("tokenizer: vocab %d saved to %s", len(wrapped), out_dir)
    return out_dir


def load_tokenizer(work_dir: Path):  # noqa: ANN201 - transformers tokenizer class differs across versions
    """Load the trained tokenizer from ``work_dir/tokenizer``."""
    from transformers import AutoTokenizer

    folder = work_dir / "tokenizer"
    if not (folder / "tokenizer.json").exists():
        raise SystemExit(f"no tokenizer in {folder}: run the 'tokenizer' phase first")
    return AutoTokenizer.from_pretrained(folder)


# --------------------------------------------------------------------------------------------------------------
# Token caches
# --------------------------------------------------------------------------------------------------------------


def tokenize_files(tokenizer, files: list[default_corpus.CorpusFile]) -> np.ndarray:  # noqa: ANN001
    """Token ids of the files joined as ``doc0 <eos> doc1 <eos> ...`` as a uint16 array ``[N]``."""
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    backend = tokenizer.backend_tokenizer
    ids: list[int] = []
    batch = 64
    for start in tqdm(range(0, len(files), batch), desc="tokenise", unit="batch", leave=False):
        encodings = backend.encode_batch([f.text for f in files[start : start + batch]], add_special_tokens=False)
        for enc in encodings:
            ids.extend(enc.ids)
            ids.append(eos_id)
    return np.asarray(ids, dtype=np.uint16)


def token_caches(work_dir: Path, tokenizer, corpus_root: Path | None = None) -> tuple[np.ndarray, np.ndarray, dict]:  # noqa: ANN001
    """Return memory-mapped (train, heldout) token arrays, building ``*.npy`` caches on first use.

    ``corpus_root`` replaces the interpreter's standard library as the corpus (tests); the cache is rebuilt whenever
    the corpus hash or the tokenizer differs from the one it was built from.
    """
    corpus = default_corpus.load_corpus(corpus_root)
    tok_hash = sha256_file(work_dir / "tokenizer" / "tokenizer.json")
    meta_path = work_dir / "tokens_meta.json"
    expected = {"corpus_hash": corpus.corpus_hash, "tokenizer_sha256": tok_hash}
    cached = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if {k: cached.get(k) for k in expected} != expected:
        log.info("tokenising corpus (train %d files, heldout %d files)", len(corpus.train), len(corpus.heldout))
        for name, files in (("train", corpus.train), ("heldout", corpus.heldout)):
            arr = tokenize_files(tokenizer, files)
            atomic_save_npy(work_dir / f"{name}_tokens.npy", arr)
            expected[f"{name}_tokens"] = int(arr.size)
        expected["corpus"] = corpus.summary()
        atomic_write_text(meta_path, json.dumps(expected, indent=2))
        cached = expected
    train = np.load(work_dir / "train_tokens.npy", mmap_mode="r")
    heldout = np.load(work_dir / "heldout_tokens.npy", mmap_mode="r")
    log.info("tokens: train %d, heldout %d", train.size, heldout.size)
    return train, heldout, cached


# --------------------------------------------------------------------------------------------------------------
# Models, schedule, evaluation
# --------------------------------------------------------------------------------------------------------------


def build_model(spec: ModelSpec, vocab_size: int, seq_len: int, eos_id: int) -> torch.nn.Module:
    """A freshly initialised Llama with tied embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=max_positions(seq_len),
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    return LlamaForCausalLM(config)


def count_params(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_factor(step: int, plan: RunPlan) -> float:
    """Linear warmup then cosine decay to ``min_lr_ratio``, as a multiplier of the peak learning rate."""
    warmup = max(1, int(plan.warmup_frac * plan.total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, plan.total_steps - warmup))
    return plan.min_lr_ratio + (1 - plan.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def sample_batch(tokens: np.ndarray, plan: RunPlan, generator: torch.Generator) -> torch.Tensor:
    """Random contiguous windows ``[B, T+1]`` int64: position t is trained to predict t + 1 (T targets per row)."""
    starts = torch.randint(0, tokens.size - plan.seq_len - 1, (plan.batch_size,), generator=generator)
    windows = np.stack([np.asarray(tokens[s : s + plan.seq_len + 1], dtype=np.int64) for s in starts.tolist()])
    return torch.from_numpy(windows)  # [B, T+1]


def window_loss(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats/token) of ``model`` over every target of ``windows`` ``[B, T+1]``.

    The library's ``lm_loss`` scores logits at positions 0..T-1 against tokens 1..T; the logits of the last position
    are computed and not used (causal attention: they change none of the others).
    """
    logits = model(input_ids=windows).logits  # [B, T+1, V]
    return lm_loss(logits, windows, torch.ones_like(windows))


def eval_windows(heldout: np.ndarray, seq_len: int, limit: int | None) -> np.ndarray:
    """Fixed held-out windows ``[N, T+1]``: all non-overlapping ones, or ``limit`` evenly spaced among them."""
    n_all = (heldout.size - 1) // seq_len
    index = np.arange(n_all) if limit is None or limit >= n_all else np.linspace(0, n_all - 1, limit).astype(int)
    return np.stack([np.asarray(heldout[i * seq_len : i * seq_len + seq_len + 1], dtype=np.int64) for i in index])


def evaluate(model: torch.nn.Module, windows: np.ndarray, device: str, batch_size: int = 16) -> float:
    """Token-weighted mean held-out loss (nats/token) over ``windows`` ``[N, T+1]``, by the library's evaluator."""

    def batches():  # noqa: ANN202 - a generator of the evaluator's batch dicts
        for start in range(0, len(windows), batch_size):
            chunk = torch.from_numpy(windows[start : start + batch_size]).to(device)  # [b, T+1]
            ones = torch.ones_like(chunk)
            yield {"input_ids": chunk, "attention_mask": ones, "loss_mask": ones}

    model.eval()
    loss = heldout_lm_loss(model, batches())
    model.train()
    return loss


# --------------------------------------------------------------------------------------------------------------
# Phase 2: train
# --------------------------------------------------------------------------------------------------------------


def plan_from_args(args: argparse.Namespace) -> RunPlan:
    """The run plan described by the command-line options."""
    return RunPlan(
        seed=args.seed,
        vocab_size=args.vocab_size,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        token_budget=args.token_budget,
        base=ModelSpec(args.base_hidden, args.base_layers, args.base_heads, args.base_intermediate),
        draft=ModelSpec(args.draft_hidden, args.draft_layers, args.draft_heads, args.draft_intermediate),
        lr=args.lr,
        draft_lr=args.draft_lr,
        min_lr_ratio=args.min_lr_ratio,
        warmup_frac=args.warmup_frac,
        weight_decay=args.weight_decay,
    )


def plan_from_dict(data: dict) -> RunPlan:
    """Rebuild a ``RunPlan`` saved with ``dataclasses.asdict``."""
    data = dict(data)
    data["base"], data["draft"] = ModelSpec(**data["base"]), ModelSpec(**data["draft"])
    return RunPlan(**data)


@dataclass
class TrainState:
    """Mutable training state saved in every checkpoint."""

    step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0
    history: list | None = None


def save_checkpoint(directory: Path, plan: RunPlan, models: dict, optims: dict, state: TrainState, gen) -> None:  # noqa: ANN001
    """Write the training state into ``directory``: tensors as safetensors, everything else as JSON, nothing pickled.

    ``tensors-<step>.safetensors`` holds ``model.<name>.<param>``, the optimiser moments
    ``optim.<name>.state.<param index>.<key>`` and the torch RNG states ``rng.torch`` / ``rng.data`` (uint8).
    ``state.json`` holds the plan, counters, eval history, the optimisers' ``param_groups``, the Python and numpy RNG
    states and the name and sha256 of that tensor file. Both go through the library's atomic writer, tensors first,
    so ``state.json`` always names a complete tensor file; older tensor files are removed last.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"rng.torch": torch.get_rng_state(), "rng.data": gen.get_state()}
    optim_records = {}
    for name, model in models.items():
        # clone: tied embeddings share storage, which safetensors refuses to write twice
        tensors.update(
            {f"model.{name}.{key}": value.detach().cpu().clone() for key, value in model.state_dict().items()}
        )
        optim_records[name] = flatten_optimizer(optims[name].state_dict(), f"optim.{name}", tensors)
    tensors_name = f"tensors-{state.step:08d}.safetensors"
    atomic_write(
        directory / tensors_name, lambda temporary: save_file(tensors, str(temporary), metadata={"format": "pt"})
    )
    python_version, python_keys, python_gauss = random.getstate()
    numpy_name, numpy_keys, numpy_pos, numpy_has_gauss, numpy_gauss = np.random.get_state()
    record = {
        "format": CHECKPOINT_FORMAT,
        "tensors": tensors_name,
        "tensors_sha256": sha256_file(directory / tensors_name),
        "plan": asdict(plan),
        "state": asdict(state),
        "optims": optim_records,
        "rng": {
            "python": [python_version, list(python_keys), python_gauss],
            "numpy": [numpy_name, numpy_keys.tolist(), numpy_pos, numpy_has_gauss, numpy_gauss],
        },
    }
    atomic_write_text(directory / CHECKPOINT_STATE, json.dumps(record, indent=1) + "\n")
    for old in directory.glob("tensors-*.safetensors"):
        if old.name != tensors_name:
            old.unlink()


def flatten_optimizer(state_dict: dict, prefix: str, tensors: dict[str, torch.Tensor]) -> dict:
    """Move an optimiser ``state_dict``'s tensors into ``tensors`` as ``<prefix>.state.<index>.<key>``.

    Returns:
        The JSON part: ``param_groups`` (hyper-parameters and parameter indices) and any non-tensor per-parameter
        state under ``state_other``.
    """
    other: dict[str, dict] = {}
    for index, values in state_dict["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}.state.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                other.setdefault(str(index), {})[key] = value
    return {"param_groups": state_dict["param_groups"], "state_other": other}


def unflatten_optimizer(record: dict, prefix: str, tensors: dict[str, torch.Tensor]) -> dict:
    """The optimiser ``state_dict`` that :func:`flatten_optimizer` split into ``record`` (JSON) and ``tensors``."""
    state: dict[int, dict] = {}
    marker = f"{prefix}.state."
    for key, value in tensors.items():
        if key.startswith(marker):
            index, name = key[len(marker) :].split(".", 1)
            state.setdefault(int(index), {})[name] = value
    for index, values in record["state_other"].items():
        state.setdefault(int(index), {}).update(values)
    # JSON turned tuples (AdamW's betas) into lists; "params" is the one list that stays a list
    groups = [
        {key: tuple(value) if isinstance(value, list) and key != "params" else value for key, value in group.items()}
        for group in record["param_groups"]
    ]
    return {"state": state, "param_groups": groups}


def find_checkpoint(work_dir: Path) -> Path | None:
    """The checkpoint folder of ``work_dir``, or None before the first checkpoint; a pickled one is refused."""
    directory = work_dir / CHECKPOINT_DIR
    if (directory / CHECKPOINT_STATE).is_file():
        return directory
    if (work_dir / PICKLED_CHECKPOINT).exists():
        raise SystemExit(
            f"{work_dir / PICKLED_CHECKPOINT} is a pickled checkpoint of an older pretrain_default.py; specheads "
            "never unpickles (arbitrary code execution). Start again in a new --work-dir."
        )
    return None


def load_checkpoint(directory: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read a checkpoint written by :func:`save_checkpoint`: its JSON record and its tensors (on the CPU).

    Only ``json`` and ``safetensors`` are read; the tensor file must have the sha256 that the record names.
    """
    record = json.loads((directory / CHECKPOINT_STATE).read_text())
    if record.get("format") != CHECKPOINT_FORMAT:
        raise SystemExit(f"{directory / CHECKPOINT_STATE}: unknown checkpoint format {record.get('format')!r}")
    path = directory / record["tensors"]
    if not path.is_file() or sha256_file(path) != record["tensors_sha256"]:
        raise SystemExit(f"{path} is missing or does not match {directory / CHECKPOINT_STATE}: damaged checkpoint")
    return record, load_file(str(path))


def model_tensors(tensors: dict[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    """The state dict of model ``name`` (``base`` or ``draft``) among a checkpoint's tensors."""
    prefix = f"model.{name}."
    return {key[len(prefix) :]: value for key, value in tensors.items() if key.startswith(prefix)}


def restore_checkpoint(record: dict, tensors: dict, models: dict, optims: dict, gen: torch.Generator) -> TrainState:
    """Load models, optimisers and every RNG from a checkpoint; return its training state."""
    for name, model in models.items():
        model.load_state_dict(model_tensors(tensors, name))
        optims[name].load_state_dict(unflatten_optimizer(record["optims"][name], f"optim.{name}", tensors))
    python_version, python_keys, python_gauss = record["rng"]["python"]
    random.setstate((python_version, tuple(python_keys), python_gauss))
    numpy_name, numpy_keys, *numpy_rest = record["rng"]["numpy"]
    np.random.set_state((numpy_name, np.asarray(numpy_keys, dtype=np.uint32), *numpy_rest))
    torch.set_rng_state(tensors["rng.torch"])
    gen.set_state(tensors["rng.data"])
    return TrainState(**record["state"])


def check_resumable(saved: RunPlan, plan: RunPlan, allow_replan: bool, state_step: int) -> None:
    """Refuse to resume under a different plan, except a new token budget when ``--allow-replan`` is given.

    Re-planning the budget mid-run stretches or shrinks the rest of the cosine schedule from the current step on;
    the models, data order and optimiser state are unchanged.
    """
    if saved == plan:
        return
    if allow_replan and replace(saved, token_budget=plan.token_budget) == plan:
        log.warning(
            "re-planned token budget at step %d: %d -> %d tokens (%d -> %d steps)",
            state_step,
            saved.token_budget,
            plan.token_budget,
            saved.total_steps,
            plan.total_steps,
        )
        if plan.total_steps <= state_step:
            raise SystemExit("the new token budget is already spent")
        return
    raise SystemExit(f"checkpoint plan differs from the command line:\n saved {saved}\n now   {plan}")


def init_training(args: argparse.Namespace, plan: RunPlan, eos_id: int) -> tuple[dict, dict, TrainState, object]:
    """Build models and optimisers, then restore them from the work dir's checkpoint if it has one."""
    seed_everything(plan.seed)
    models = {
        "base": build_model(plan.base, plan.vocab_size, plan.seq_len, eos_id).to(args.device),
        "draft": build_model(plan.draft, plan.vocab_size, plan.seq_len, eos_id).to(args.device),
    }
    optims = {
        "base": make_optimizer(models["base"], plan.lr, plan.weight_decay),
        "draft": make_optimizer(models["draft"], plan.draft_lr, plan.weight_decay),
    }
    gen = torch.Generator().manual_seed(plan.seed)
    state = TrainState(history=[])
    ckpt_dir = find_checkpoint(args.work_dir)
    if ckpt_dir is not None:
        record, tensors = load_checkpoint(ckpt_dir)
        saved_plan = plan_from_dict(record["plan"])
        check_resumable(saved_plan, plan, args.allow_replan, state_step=record["state"]["step"])
        state = restore_checkpoint(record, tensors, models, optims, gen)
        log.info("resumed from %s at step %d (%d tokens)", ckpt_dir, state.step, state.tokens_seen)
    return models, optims, state, gen


def train_step(models: dict, optims: dict, windows: torch.Tensor, factor: float, plan: RunPlan) -> dict:
    """One optimiser step of each model on the same windows ``[B, T+1]``; returns the training losses."""
    losses = {}
    for name, model in models.items():
        peak = plan.lr if name == "base" else plan.draft_lr
        for group in optims[name].param_groups:
            group["lr"] = peak * factor
        loss = window_loss(model, windows)
        optims[name].zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optims[name].step()
        losses[name] = loss.item()
    return losses


@contextlib.contextmanager
def stop_requests() -> Iterator[list[int]]:
    """Record SIGTERM/SIGINT in the yielded list instead of dying mid-step; the previous handlers return afterwards."""
    received: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda num, _frame: received.append(num))
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def log_step(state: TrainState, plan: RunPlan, losses: dict, tokens_per_second: float) -> None:
    """One progress line: step, tokens, both training losses, the step's learning rate and the recent speed."""
    log.info(
        "step %d/%d tokens %d loss base %.4f draft %.4f lr %.2e tok/s %.0f",
        state.step,
        plan.total_steps,
        state.tokens_seen,
        losses["base"],
        losses["draft"],
        plan.lr * lr_factor(state.step - 1, plan),
        tokens_per_second,
    )


def run_train(args: argparse.Namespace) -> None:
    """Train base and draft together until the token budget is spent or ``--max-minutes`` passes."""
    torch.set_num_threads(args.threads)
    plan = plan_from_args(args)
    tokenizer = load_tokenizer(args.work_dir)
    if len(tokenizer) != plan.vocab_size:
        raise SystemExit(f"tokenizer has {len(tokenizer)} tokens, plan says {plan.vocab_size}")
    train_tokens, heldout_tokens, _ = token_caches(args.work_dir, tokenizer, args.corpus_root)
    eval_sample = eval_windows(heldout_tokens, plan.seq_len, args.eval_windows)
    models, optims, state, gen = init_training(args, plan, tokenizer.eos_token_id)
    log.info("plan: %s", json.dumps(asdict(plan)))
    check_export_size(models, args.work_dir)
    log.info(
        "params: base %d, draft %d; %d steps of %d tokens; eval on %d windows",
        count_params(models["base"]),
        count_params(models["draft"]),
        plan.total_steps,
        plan.tokens_per_step,
        len(eval_sample),
    )
    ckpt_dir = args.work_dir / CHECKPOINT_DIR
    started = last_ckpt = time.time()
    window_start, window_tokens = time.time(), 0
    bar = tqdm(total=plan.total_steps, initial=state.step, desc="train", unit="step", dynamic_ncols=True)
    with stop_requests() as stop_signal:  # SIGTERM/SIGINT stop the loop after the current step, with a checkpoint
        while state.step < plan.total_steps:
            if stop_signal:
                log.info("signal %d received, stopping", stop_signal[0])
                break
            if args.max_steps is not None and state.step >= args.max_steps:
                break
            if args.max_minutes is not None and time.time() - started > 60 * args.max_minutes:
                log.info("--max-minutes %.1f reached", args.max_minutes)
                break
            t0 = time.time()
            windows = sample_batch(train_tokens, plan, gen)
            losses = train_step(models, optims, windows.to(args.device), lr_factor(state.step, plan), plan)
            state.step += 1
            state.tokens_seen += plan.tokens_per_step
            state.train_seconds += time.time() - t0
            window_tokens += plan.tokens_per_step
            bar.update(1)
            bar.set_postfix(base=f"{losses['base']:.3f}", draft=f"{losses['draft']:.3f}")
            if state.step % args.log_every == 0 or state.step == 1:
                log_step(state, plan, losses, window_tokens / max(1e-9, time.time() - window_start))
                window_start, window_tokens = time.time(), 0
            if state.step % args.eval_every == 0 or state.step == plan.total_steps:
                record_eval(models, eval_sample, args.device, state)
            if time.time() - last_ckpt > 60 * args.ckpt_minutes:
                save_checkpoint(ckpt_dir, plan, models, optims, state, gen)
                last_ckpt = time.time()
                log.info("checkpoint saved at step %d", state.step)
    bar.close()
    save_checkpoint(ckpt_dir, plan, models, optims, state, gen)
    done = "finished" if state.step >= plan.total_steps else "stopped"
    log.info(
        "%s at step %d/%d (%d tokens, %.1f min of training); checkpoint %s",
        done,
        state.step,
        plan.total_steps,
        state.tokens_seen,
        state.train_seconds / 60,
        ckpt_dir,
    )


def check_export_size(models: dict, work_dir: Path) -> None:
    """Refuse to train models whose fp32 export (weights + a tokenizer per folder) would exceed the size limit."""
    weights = sum(4 * count_params(model) for model in models.values())
    tokenizer_bytes = sum(p.stat().st_size for p in (work_dir / "tokenizer").iterdir() if p.is_file())
    estimate = weights + len(models) * tokenizer_bytes
    log.info("estimated export size %.2f MB (limit %.2f MB)", estimate / 2**20, MAX_ASSETS_BYTES / 2**20)
    if estimate > 0.98 * MAX_ASSETS_BYTES:
        raise SystemExit("these models would not fit the shipped size limit; choose smaller ones")


def record_eval(models: dict, eval_sample: np.ndarray, device: str, state: TrainState) -> None:
    """Evaluate both models on the fixed held-out sample and append to the history."""
    result = {name: evaluate(model, eval_sample, device) for name, model in models.items()}
    state.history = (state.history or []) + [{"step": state.step, "tokens": state.tokens_seen, **result}]
    log.info(
        "eval step %d tokens %d heldout loss base %.4f draft %.4f",
        state.step,
        state.tokens_seen,
        result["base"],
        result["draft"],
    )


# --------------------------------------------------------------------------------------------------------------
# Phase 3: export
# --------------------------------------------------------------------------------------------------------------


def config_summary(config) -> dict:  # noqa: ANN001
    """The fields of a Llama config that describe its size."""
    keys = [
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "tie_word_embeddings",
    ]
    return {key: getattr(config, key) for key in keys}


def save_model_folder(model: torch.nn.Module, tokenizer, folder: Path) -> None:  # noqa: ANN001
    """``save_pretrained`` the model (safetensors), its generation config and the tokenizer into ``folder``.

    The tokenizer's ``model_max_length`` is set to the model's ``max_position_embeddings``, so inputs the model
    accepts raise no "indexing errors" warning.
    """
    from transformers import GenerationConfig

    tokenizer.model_max_length = model.config.max_position_embeddings
    eos_id = tokenizer.eos_token_id
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    for path in folder.iterdir():  # safetensors writes 0600; shipped files should be world-readable
        path.chmod(0o644)


def smoke_test(folder: Path, prompt: str) -> str:
    """Load ``folder`` with the Auto classes offline and greedily complete ``prompt``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=48, do_sample=False)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])


def run_export(args: argparse.Namespace) -> None:
    """Write base/, draft/, manifest.json and README.md into the assets folder from the latest checkpoint."""
    torch.set_num_threads(args.threads)
    ckpt_dir = find_checkpoint(args.work_dir)
    if ckpt_dir is None:
        raise SystemExit(f"no checkpoint in {args.work_dir}: run the 'train' phase first")
    record, tensors = load_checkpoint(ckpt_dir)
    plan, state = plan_from_dict(record["plan"]), TrainState(**record["state"])
    tokenizer = load_tokenizer(args.work_dir)
    _, heldout_tokens, token_meta = token_caches(args.work_dir, tokenizer, args.corpus_root)
    full_eval = eval_windows(heldout_tokens, plan.seq_len, None)
    assets = args.assets_dir
    assets.mkdir(parents=True, exist_ok=True)
    models_info = {}
    for name in ("base", "draft"):
        model = build_model(getattr(plan, name), plan.vocab_size, plan.seq_len, tokenizer.eos_token_id)
        model.load_state_dict(model_tensors(tensors, name))
        model.eval()
        loss = evaluate(model, full_eval, "cpu")
        log.info("%s: heldout loss %.4f nats/token on %d windows", name, loss, len(full_eval))
        save_model_folder(model, tokenizer, assets / name)
        sample = smoke_test(assets / name, "def fibonacci(n):\n    ")
        log.info("%s sample completion: %r", name, sample)
        models_info[name] = {
            "path": name,
            "parameters": count_params(model),
            "config": config_summary(model.config),
            "tokens_seen": state.tokens_seen,
            "planned_tokens": plan.total_steps * plan.tokens_per_step,
            "steps": state.step,
            "heldout_loss_nats_per_token": round(loss, 4),
            "heldout_eval_tokens": int(full_eval[:, 1:].size),
            "training_minutes": round(state.train_seconds / 60, 1),
            "greedy_sample": {"prompt": "def fibonacci(n):\n    ", "completion": sample},
        }
    write_readme(assets, plan)
    write_manifest(args, assets, plan, state, token_meta, models_info)


def read_commands(work_dir: Path) -> list[dict]:
    """The recorded invocations of every phase, oldest first."""
    path = work_dir / "commands.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def write_manifest(args, assets: Path, plan: RunPlan, state: TrainState, token_meta: dict, models_info: dict) -> None:  # noqa: ANN001
    """manifest.json: corpus, models, training plan, commands and the sha256 of every shipped file."""
    files = {
        p.relative_to(assets).as_posix(): sha256_file(p)
        for p in sorted(assets.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }
    total = sum((assets / rel).stat().st_size for rel in files)
    previous = json.loads((assets / "manifest.json").read_text()) if (assets / "manifest.json").is_file() else {}
    manifest = {
        "name": "specheads default (stdlib Python code model + draft)",
        "created": utc_now(),
        "corpus": {
            **token_meta["corpus"],
            "train_tokens": token_meta["train_tokens"],
            "heldout_tokens": token_meta["heldout_tokens"],
        },
        "tokenizer": {
            "type": "byte-level BPE (tokenizers)",
            "vocab_size": plan.vocab_size,
            "eos": EOS,
            "trained_on": "train split only",
        },
        "training": {"plan": asdict(plan), "total_steps": plan.total_steps, "eval_history": state.history},
        "models": models_info,
        "commands": read_commands(args.work_dir),
        **({"heads": previous["heads"]} if "heads" in previous else {}),  # shipped by scripts/ship_default_heads.py
        "total_bytes": total,
        "files": files,
    }
    atomic_write_text(assets / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    log.info("manifest written; %d files, %.2f MB", len(files), total / 2**20)
    if total > MAX_ASSETS_BYTES:
        raise SystemExit(f"assets are {total / 2**20:.2f} MB, over the {MAX_ASSETS_BYTES / 2**20:.0f} MB limit")


def write_readme(assets: Path, plan: RunPlan) -> None:
    """A short README describing the shipped models and how to reproduce them."""
    text = f"""# specheads default models

Small Llama models trained from scratch on this interpreter's Python standard library sources (about 95% of the
`.py` files; the rest is held out by a hash of the file path and only used for evaluation and benchmark prompts).

- `base/`: the target model ({plan.base.layers} layers, hidden {plan.base.hidden}).
- `draft/`: a much smaller draft model ({plan.draft.layers} layer(s), hidden {plan.draft.hidden}) trained on the
  same batches with the same tokenizer, for draft-model speculative decoding.
- `eagle3/`: EAGLE-3 draft heads for the base (`SpecDecoder.from_pretrained("default", heads="default")`), trained
  with `specheads train --config configs/default/eagle3.yaml`, calibrated with `specheads calibrate` on this machine
  (`tree.json`) and shipped with `python scripts/ship_default_heads.py runs/default-eagle3/heads`.
- `prompts.jsonl`: benchmark prompts cut from held-out files (function header + docstring).
- `manifest.json`: corpus, sizes, tokens seen, held-out losses, exact commands and the sha256 of every file.

Both folders load offline with `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`.
They are tiny code models for testing and benchmarking speculative decoding, not useful assistants.

Reproduce (the exact commands used are listed in `manifest.json` under `commands`):

```
python scripts/pretrain_default.py tokenizer
python scripts/pretrain_default.py train <options from manifest.json>   # resumable; re-run to continue
python scripts/pretrain_default.py export <same options>
python scripts/make_bench_prompts.py
```
"""
    atomic_write_text(assets / "README.md", text)


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """Run one phase."""
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    setup_logging(args.work_dir, args.phase)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no GPU is available")
    seed_everything(args.seed)
    if args.phase == "tokenizer":
        train_tokenizer(args.work_dir, args.vocab_size, args.seq_len, args.corpus_root)
    elif args.phase == "train":
        run_train(args)
    else:
        run_export(args)


if __name__ == "__main__":
    main()
