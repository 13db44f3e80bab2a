"""Pretrain the embedded default models of specheads on the Python standard library.

Three phases, each resumable and deterministic for a given seed:

    tokenizer  byte-level BPE (vocab 8192, ``<|endoftext|>``) trained on the train split only
    train      a base LlamaForCausalLM and a ~5-10x smaller draft, trained in one loop on the same batches
    export     transformers-loadable folders + manifest.json under ``specheads/assets/default``

The learning-rate schedule is planned in tokens (``--token-budget``), so stopping with ``--max-minutes`` and running
the same command again continues the same run. Checkpoints and logs live in ``--work-dir`` (outside git).
"""

from __future__ import annotations

import argparse
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
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from specheads.assets import corpus as default_corpus  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
# Checkpoints and token caches live outside git; SPECHEADS_PRETRAIN_DIR moves them.
DEFAULT_WORK_DIR = Path(os.environ.get("SPECHEADS_PRETRAIN_DIR", Path.home() / ".cache" / "specheads" / "pretrain"))
DEFAULT_ASSETS_DIR = REPO_ROOT / "specheads" / "assets" / "default"
EOS = "<|endoftext|>"
MAX_ASSETS_BYTES = 25 * 1024 * 1024
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
    """Log to ``work_dir/<phase>.log`` (appending) and to stderr, and record the exact command line."""
    work_dir.mkdir(parents=True, exist_ok=True)
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
    """Write a text file via a temporary file and ``os.replace``."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------------------
# Phase 1: tokenizer
# --------------------------------------------------------------------------------------------------------------


def train_tokenizer(work_dir: Path, vocab_size: int, seq_len: int) -> Path:
    """Train a byte-level BPE on the train split and save it as a transformers fast tokenizer.

    Returns:
        The folder ``work_dir/tokenizer`` that ``AutoTokenizer.from_pretrained`` loads offline.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = default_corpus.load_corpus()
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
        model_max_length=seq_len,
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


def token_caches(work_dir: Path, tokenizer) -> tuple[np.ndarray, np.ndarray, dict]:  # noqa: ANN001
    """Return memory-mapped (train, heldout) token arrays, building ``*.npy`` caches on first use."""
    corpus = default_corpus.load_corpus()
    tok_hash = sha256_file(work_dir / "tokenizer" / "tokenizer.json")
    meta_path = work_dir / "tokens_meta.json"
    expected = {"corpus_hash": corpus.corpus_hash, "tokenizer_sha256": tok_hash}
    cached = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if {k: cached.get(k) for k in expected} != expected:
        log.info("tokenising corpus (train %d files, heldout %d files)", len(corpus.train), len(corpus.heldout))
        for name, files in (("train", corpus.train), ("heldout", corpus.heldout)):
            arr = tokenize_files(tokenizer, files)
            tmp = work_dir / f"{name}_tokens.tmp.npy"
            np.save(tmp, arr)
            os.replace(tmp, work_dir / f"{name}_tokens.npy")
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
        max_position_embeddings=max(2048, seq_len),
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


def sample_batch(tokens: np.ndarray, plan: RunPlan, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random contiguous windows: inputs and next-token targets, each ``[B, T]`` int64."""
    starts = torch.randint(0, tokens.size - plan.seq_len - 1, (plan.batch_size,), generator=generator)
    windows = np.stack([np.asarray(tokens[s : s + plan.seq_len + 1], dtype=np.int64) for s in starts.tolist()])
    windows_t = torch.from_numpy(windows)  # [B, T+1]
    return windows_t[:, :-1], windows_t[:, 1:]


def lm_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats/token."""
    logits = model(input_ids=inputs).logits  # [B, T, V]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def eval_windows(heldout: np.ndarray, seq_len: int, limit: int | None) -> np.ndarray:
    """Fixed held-out windows ``[N, T+1]``: all non-overlapping ones, or ``limit`` evenly spaced among them."""
    n_all = (heldout.size - 1) // seq_len
    index = np.arange(n_all) if limit is None or limit >= n_all else np.linspace(0, n_all - 1, limit).astype(int)
    return np.stack([np.asarray(heldout[i * seq_len : i * seq_len + seq_len + 1], dtype=np.int64) for i in index])


@torch.no_grad()
def evaluate(model: torch.nn.Module, windows: np.ndarray, device: str, batch_size: int = 16) -> float:
    """Token-weighted mean held-out loss (nats/token) over the given windows."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(windows), batch_size):
        chunk = torch.from_numpy(windows[start : start + batch_size]).to(device)
        loss = lm_loss(model, chunk[:, :-1], chunk[:, 1:])
        total += loss.item() * chunk[:, 1:].numel()
        count += chunk[:, 1:].numel()
    model.train()
    return total / count


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


def save_checkpoint(path: Path, plan: RunPlan, models: dict, optims: dict, state: TrainState, gen) -> None:  # noqa: ANN001
    """Write model + optimiser + RNG state atomically (tmp file, then ``os.replace``)."""
    payload = {
        "plan": asdict(plan),
        "state": asdict(state),
        "models": {name: m.state_dict() for name, m in models.items()},
        "optims": {name: o.state_dict() for name, o in optims.items()},
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "data": gen.get_state(),
        },
    }
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    """Load a checkpoint written by ``save_checkpoint`` on the CPU."""
    return torch.load(path, map_location="cpu", weights_only=False)


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
    """Build models and optimisers, then restore them from ``ckpt.pt`` if the work dir has one."""
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
    ckpt_path = args.work_dir / "ckpt.pt"
    if ckpt_path.exists():
        ckpt = load_checkpoint(ckpt_path)
        saved_plan = plan_from_dict(ckpt["plan"])
        check_resumable(saved_plan, plan, args.allow_replan, state_step=ckpt["state"]["step"])
        for name in models:
            models[name].load_state_dict(ckpt["models"][name])
            optims[name].load_state_dict(ckpt["optims"][name])
        state = TrainState(**ckpt["state"])
        random.setstate(ckpt["rng"]["python"])
        np.random.set_state(ckpt["rng"]["numpy"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        gen.set_state(ckpt["rng"]["data"])
        log.info("resumed from %s at step %d (%d tokens)", ckpt_path, state.step, state.tokens_seen)
    return models, optims, state, gen


def train_step(
    models: dict, optims: dict, inputs: torch.Tensor, targets: torch.Tensor, factor: float, plan: RunPlan
) -> dict:
    """One optimiser step of each model on the same batch; returns the training losses."""
    losses = {}
    for name, model in models.items():
        peak = plan.lr if name == "base" else plan.draft_lr
        for group in optims[name].param_groups:
            group["lr"] = peak * factor
        loss = lm_loss(model, inputs, targets)
        optims[name].zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optims[name].step()
        losses[name] = loss.item()
    return losses


def run_train(args: argparse.Namespace) -> None:
    """Train base and draft together until the token budget is spent or ``--max-minutes`` passes."""
    torch.set_num_threads(args.threads)
    plan = plan_from_args(args)
    tokenizer = load_tokenizer(args.work_dir)
    if len(tokenizer) != plan.vocab_size:
        raise SystemExit(f"tokenizer has {len(tokenizer)} tokens, plan says {plan.vocab_size}")
    train_tokens, heldout_tokens, _ = token_caches(args.work_dir, tokenizer)
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
    ckpt_path = args.work_dir / "ckpt.pt"
    started = last_ckpt = time.time()
    window_start, window_tokens = time.time(), 0
    bar = tqdm(total=plan.total_steps, initial=state.step, desc="train", unit="step", dynamic_ncols=True)
    stop_signal: list[int] = []  # SIGTERM/SIGINT stop the loop after the current step, with a checkpoint
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda num, _frame: stop_signal.append(num))
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
        inputs, targets = sample_batch(train_tokens, plan, gen)
        factor = lr_factor(state.step, plan)
        losses = train_step(models, optims, inputs.to(args.device), targets.to(args.device), factor, plan)
        state.step += 1
        state.tokens_seen += plan.tokens_per_step
        state.train_seconds += time.time() - t0
        window_tokens += plan.tokens_per_step
        bar.update(1)
        bar.set_postfix(base=f"{losses['base']:.3f}", draft=f"{losses['draft']:.3f}")
        if state.step % args.log_every == 0 or state.step == 1:
            rate = window_tokens / max(1e-9, time.time() - window_start)
            log.info(
                "step %d/%d tokens %d loss base %.4f draft %.4f lr %.2e tok/s %.0f",
                state.step,
                plan.total_steps,
                state.tokens_seen,
                losses["base"],
                losses["draft"],
                plan.lr * lr_factor(state.step - 1, plan),
                rate,
            )
            window_start, window_tokens = time.time(), 0
        if state.step % args.eval_every == 0 or state.step == plan.total_steps:
            record_eval(models, eval_sample, args.device, state)
        if time.time() - last_ckpt > 60 * args.ckpt_minutes:
            save_checkpoint(ckpt_path, plan, models, optims, state, gen)
            last_ckpt = time.time()
            log.info("checkpoint saved at step %d", state.step)
    bar.close()
    save_checkpoint(ckpt_path, plan, models, optims, state, gen)
    done = "finished" if state.step >= plan.total_steps else "stopped"
    log.info(
        "%s at step %d/%d (%d tokens, %.1f min of training); checkpoint %s",
        done,
        state.step,
        plan.total_steps,
        state.tokens_seen,
        state.train_seconds / 60,
        ckpt_path,
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
    """``save_pretrained`` the model (safetensors), its generation config and the tokenizer into ``folder``."""
    from transformers import GenerationConfig

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
    ckpt = load_checkpoint(args.work_dir / "ckpt.pt")
    plan, state = plan_from_dict(ckpt["plan"]), TrainState(**ckpt["state"])
    tokenizer = load_tokenizer(args.work_dir)
    _, heldout_tokens, token_meta = token_caches(args.work_dir, tokenizer)
    full_eval = eval_windows(heldout_tokens, plan.seq_len, None)
    assets = args.assets_dir
    assets.mkdir(parents=True, exist_ok=True)
    models_info = {}
    for name in ("base", "draft"):
        model = build_model(getattr(plan, name), plan.vocab_size, plan.seq_len, tokenizer.eos_token_id)
        model.load_state_dict(ckpt["models"][name])
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("phase", choices=["tokenizer", "train", "export"])
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="checkpoints, caches and logs")
    p.add_argument("--assets-dir", type=Path, default=DEFAULT_ASSETS_DIR, help="export destination")
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


def main(argv: list[str] | None = None) -> None:
    """Run one phase."""
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    setup_logging(args.work_dir, args.phase)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no GPU is available")
    seed_everything(args.seed)
    if args.phase == "tokenizer":
        train_tokenizer(args.work_dir, args.vocab_size, args.seq_len)
    elif args.phase == "train":
        run_train(args)
    else:
        run_export(args)


if __name__ == "__main__":
    main()
