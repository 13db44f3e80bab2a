"""vLLM speculators' EAGLE-3 trainer on the data of specheads' recipe A/B, scored with specheads' held-out evaluation.

    # 1. speculators' offline data from the A/B's feature cache (read only) plus the 160 held-out chats
    python scripts/speculators_peer.py convert --records 3700 --out runs/peer/data-3700
    # 2. speculators' own trainer (speculators.train.cli.main) and its defaults, on this CPU, one thread
    OMP_NUM_THREADS=1 python scripts/speculators_peer.py train --data runs/peer/data-3700 --out runs/peer/train-3700
    # 3. both heads on the held-out chats: agreement by depth and simulated tau, as learning_curve.py reports them
    python scripts/speculators_peer.py score --heads runs/peer/train-3700/checkpoints/0 \\
        --heads runs/ab/base/records-3700/heads --out runs/peer/score-3700

Every step is resumable: run the same command again after a stop.

**convert** writes speculators' offline-data format (``speculators.train.data.ArrowDataset``): an arrow dataset
(``input_ids``, ``loss_mask``, ``seq_len``; torch format) and ``hidden_states/hs_{i}.safetensors`` per row with
``hidden_states`` ``[T, 4, H]`` (the three fused layers, then the verifier's last hidden state) and ``token_ids``
``[T]``; speculators' loader turns them into ``hidden_states [T, 3H]``, ``verifier_last_hidden_states [T, H]``,
``loss_mask``, ``lengths``, ``position_ids``. The training rows are the recipe's first ``--records`` rows, read from
the feature cache the A/B trained from (its row digests are checked against the recipe's rows; the cache is only
read). The 160 held-out chats (``data.eval_paths``) follow as the last rows, their features computed here by
specheads' own cache writer into ``heldout-features`` beside ``OUT`` (shared by the conversions in that folder):
``train --train-data-ratio`` puts exactly them in speculators' validation split, so its own metrics (``full_acc_k``,
``cond_acc_k``) are measured on the same chats as specheads'. ``token_freq.pt`` (speculators'
``save_token_frequency_distribution`` over the training rows) lets its trainer build the draft vocabulary. The
feature cache holds the *post-norm* final state (transformers' ``hidden_states[-1]``), while speculators' targets
are ``lm_head(verifier_norm(state))`` of the *pre-norm* one; ``state / norm.weight`` gives back exactly those
targets (an RMSNorm of ``y / w``, with ``y = w * x / rms(x)``, is ``y`` again up to its epsilon), so that is what is
stored (refused when the state does not look post-norm).

**train** runs ``speculators.train.cli.main`` with ``speculators train``'s defaults (EAGLE-3, one Llama layer,
``norm_before_fc``, ``norm_output``, ``norm_before_residual``, TTT 3, KL loss, Muon + AdamW at lr 1e-3, linear decay
with 1 % warmup, ``total_seq_len`` 8192 packing, bf16 features, seed 42) except for these settings, each a flag of its
own CLI:

- ``--epochs 1`` (default 20): one pass over the same 1M tokens the A/B heads saw;
- ``--draft-vocab-size 6144`` (default: the full 49,152): the A/B recipe's size, built by speculators itself from
  ``token_freq.pt`` (its most frequent target tokens);
- ``--draft-attn-impl sdpa`` (default ``simple_flex_attention``): torch's FlexAttention has no backward on a CPU
  (``NotImplementedError``); speculators offers sdpa "for hardware that doesn't support flex attention". Its mask is
  dense, so a packed 8192-token step pays attention across documents that the flex block mask would skip;
- ``--loss-implementation eager`` (default ``fused``): the fused loss is a Triton kernel (no Triton on a CPU);
- ``--num-workers 0`` (default 12 spawned loader processes, each importing torch): 2 cores and 23 GB here;
- ``--on-missing raise`` (default ``generate``, which asks a vLLM server for missing hidden states);
- ``--train-data-ratio (N + 0.5) / (N + 160)``: the training split is the N training rows, the validation split the
  160 held-out chats;
- ``--checkpoint-freq 0.1`` (default 1: only at the end of an epoch): a checkpoint every tenth of the epoch, from
  which speculators' trainer resumes mid-epoch (``checkpoints/0/training_state.json`` says where it stood; its
  checkpoints hold weights and optimizer state in bf16, so a resumed run goes on from their rounding). A SIGTERM
  makes it save ``checkpoints/interrupted``, which it does not resume from: the last tenth is what counts;
- ``--target-layer-ids 2 15 27``: its own default for 30 layers, given because the converted features are these.

and with these patches of its trainer, applied only where torch has no accelerator (a GPU runs it unpatched):

1. ``speculators.train.trainer.get_local_rank`` returns ``"cpu"``: the trainer moves the model and every batch to
   ``local_rank``, the integer 0, which torch reads as ``cuda:0``;
2. the trainer's ``device_type`` is ``"cpu"``: with no accelerator it falls back to ``"cuda"``, where
   ``torch.autocast("cuda")`` is disabled on a CPU and the float32 weights then meet the bf16 features (a dtype
   error); on the CPU it runs bf16 autocast, as speculators does on a GPU and as the A/B recipe does here;
3. ``speculators.train.checkpointer.get_current_device`` returns ``"cpu"`` (it says ``cuda:0`` without an
   accelerator, where a resumed run would load its checkpoint);
4. ``torch.accelerator.synchronize`` is a no-op: the trainer's step timer calls it every logged step and it raises
   without an accelerator (CPU work is synchronous: the timings stay right).

Metrics (speculators' own: loss, ``full_acc_k``, ``cond_acc_k``, tokens/s) go to ``OUT/metrics.jsonl``; the
checkpoints to ``OUT/checkpoints`` (speculators' layout: ``0/model.safetensors``, ``0/val_metrics.json``).

**score** loads each ``--heads`` folder into specheads (native heads, or a speculators checkpoint through specheads'
speculators importer) and runs the recipe's held-out evaluation (``data.eval_paths``, ``data.eval_batches`` batches of
``train.batch_size``): agreement with the base's greedy token by depth and simulated tau, the numbers
``learning_curve.py`` reports. specheads' EAGLE-3 head has no ``norm_before_fc`` (one RMSNorm over the concatenated
features before ``fc``), speculators' default; with ``norm_before_residual`` it folds exactly into ``fc``: the draft
layer reads ``fc``'s output only through its ``hidden_norm`` (residual included), which ignores a positive scale, so
``fc(w * x / rms(x))`` can become ``(fc * w)(x)``. The folded checkpoint is written next to the scores
(``OUT/<name>-folded``, still the speculators format) and one draft step of it in specheads is compared with
speculators' own model on the original checkpoint (``parity`` in ``score.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CONFIG = "configs/smollm2-135m/eagle3-large.yaml"
META = "meta.json"  # written last by convert: the folder is complete
METRICS = "metrics.jsonl"
DRAFT_VOCAB = 6144  # the A/B recipe's heads.draft_vocab_size
CHECKPOINT_FREQ = 0.1


# ================================================================================================ convert
def convert(args: argparse.Namespace) -> None:
    import dataclasses

    import torch
    from tqdm.auto import tqdm

    from specheads.heads.checkpoint import fingerprint
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.methods.eagle.heads import default_layer_ids
    from specheads.training.config import load_config
    from specheads.training.data import build_dataset
    from specheads.training.features import ROWS, CachedFeatures, row_digests, rows_fingerprint, write_feature_cache
    from specheads.training.files import eval_data, expand_data_paths

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    config = load_config(args.config, [f"data.limit={args.records}", *args.overrides])
    tokenizer = load_tokenizer(config.model.tokenizer or config.model.base)
    base = load_causal_lm(config.model.base, dtype=config.model.dtype)
    final = int(base.config.num_hidden_layers)
    layers = sorted(config.heads.layer_ids or default_layer_ids(final))

    cache = CachedFeatures(args.cache, rows=args.records)
    train_rows = build_dataset(
        dataclasses.replace(config.data, paths=expand_data_paths(config.data.paths)), tokenizer
    ).with_format("torch")
    recorded = json.loads((Path(args.cache) / ROWS).read_text())
    if cache.identity["base_fingerprint"] != fingerprint(base):
        sys.exit(f"{args.cache} holds the features of another base than {config.model.base}")
    if not {*layers, final} <= set(cache.layers):
        sys.exit(f"{args.cache} holds layers {cache.layers}; the heads read {layers} and the final state {final}")
    if len(cache) < len(train_rows) or recorded[: len(train_rows)] != row_digests(train_rows):
        sys.exit(f"the first {len(train_rows)} rows of {args.cache} are not the recipe's {len(train_rows)} rows")

    heldout_rows = build_dataset(eval_data(config.data), tokenizer).with_format("torch")
    heldout_dir = out.parent / "heldout-features"  # shared by every conversion beside this one
    write_feature_cache(base, heldout_rows, layers, heldout_dir, rows_fingerprint(heldout_rows))
    heldout = CachedFeatures(heldout_dir)
    norm_weight = base.model.norm.weight.detach().float().cpu()  # [H]: the final RMSNorm's weight
    _check_post_norm(cache[0][f"hidden.{final}"], norm_weight)

    out.mkdir(parents=True, exist_ok=True)
    states = out / "hidden_states"
    states.mkdir(exist_ok=True)
    sources = [(cache, index) for index in range(len(train_rows))] + [(heldout, index) for index in range(len(heldout))]
    ids, masks = [], []  # the rows' tokens and loss masks; their features go to disk one row at a time
    for index, (features, row_index) in enumerate(tqdm(sources, desc="hidden states", unit="row")):
        row = features[row_index]
        ids.append(row["input_ids"].long())
        masks.append(row["loss_mask"].long())
        _write_sample(states / f"hs_{index}.safetensors", row, layers, final, norm_weight)
    dataset = _arrow_rows(ids, masks)
    dataset.save_to_disk(str(out))
    _token_freq(dataset.select(range(len(train_rows))), out / "token_freq.pt")
    meta = {
        "records": args.records,
        "train_rows": len(train_rows),
        "heldout_rows": len(heldout),
        "train_tokens": int(sum(len(row) for row in ids[: len(train_rows)])),
        "train_targets": int(sum(int(mask.sum()) for mask in masks[: len(train_rows)])),
        "train_data_ratio": (len(train_rows) + 0.5) / len(ids),
        "layers": layers,
        "final_layer": final,
        "verifier": str(_verifier_dir(config.model.base)),
        "feature_cache": str(args.cache),
        "config": args.config,
    }
    (out / META).write_text(json.dumps(meta, indent=2) + "\n")
    print(
        f"{out}: {meta['train_rows']} training rows ({meta['train_tokens']:,} tokens) + {meta['heldout_rows']} "
        f"held-out rows; train with --data {out}"
    )


def _check_post_norm(final_state: torch.Tensor, norm_weight: torch.Tensor) -> None:
    """Refuse a final state that is not RMSNorm's output: ``state / weight`` must have a root mean square of 1."""
    import torch

    rms = (final_state.float() / norm_weight).pow(2).mean(dim=-1).sqrt()  # [T]
    if not torch.allclose(rms, torch.ones_like(rms), atol=0.02):
        sys.exit(
            f"the cached final state is not post-norm (rms of state / norm weight {rms.min():.3f}..{rms.max():.3f})"
        )


def _arrow_rows(ids: list[torch.Tensor], masks: list[torch.Tensor]) -> Any:
    """speculators' preprocessed dataset: ``input_ids`` and ``loss_mask`` as int64, ``seq_len``, torch format."""
    import datasets

    dataset = datasets.Dataset.from_dict(
        {
            "input_ids": [row.tolist() for row in ids],
            "loss_mask": [mask.tolist() for mask in masks],
            "seq_len": [len(row) for row in ids],
        },
        features=datasets.Features(
            {
                "input_ids": datasets.List(datasets.Value("int64")),
                "loss_mask": datasets.List(datasets.Value("int64")),
                "seq_len": datasets.Value("int64"),
            }
        ),
    )
    dataset.set_format(type="torch")
    return dataset


def _write_sample(
    path: Path, row: dict[str, torch.Tensor], layers: list[int], final: int, norm_weight: torch.Tensor
) -> None:
    """One ``hs_{i}.safetensors`` as vLLM's hidden-states connector writes it (kept when present: resumable)."""
    import torch
    from safetensors.torch import save_file

    if path.is_file():
        return
    pre_norm = (row[f"hidden.{final}"].float() / norm_weight).to(torch.bfloat16)  # [T, H]
    hidden = torch.stack([*(row[f"hidden.{layer}"] for layer in layers), pre_norm], dim=1)  # [T, 4, H]
    partial = path.with_name(path.name + ".partial")  # not .lock: speculators' reader waits on those
    save_file({"hidden_states": hidden.contiguous(), "token_ids": row["input_ids"].long().contiguous()}, str(partial))
    os.replace(partial, path)


def _token_freq(dataset: Any, path: Path) -> None:
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    save_token_frequency_distribution(dataset, path)  # kept when present (speculators' own rule)


def _verifier_dir(base: str) -> Path:
    """The transformers folder of the base (speculators loads the verifier's config, embedding, norm and lm_head):
    specheads' named bases and GGUF files resolve to the folder they were dequantized into."""
    from specheads import assets

    return Path(assets.resolve(base)).expanduser().resolve()


# ================================================================================================ train
def train(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    data = Path(args.data)
    meta_path = data / META
    if not meta_path.is_file():
        sys.exit(f"{data} is not a finished conversion (no {META}); run convert first")
    meta = json.loads(meta_path.read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    argv = speculators_argv(args, meta, out)
    (out / "speculators_argv.json").write_text(json.dumps(argv, indent=2) + "\n")
    print("speculators train " + " ".join(argv))
    _where_it_stood(out, "before")

    from speculators.train import cli
    from speculators.train.config import TrainConfig

    _patch_for_cpu()
    _log_metrics_to(cli, out / METRICS)
    started = time.perf_counter()
    cli.main(TrainConfig.resolve(argv))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"trained in {time.perf_counter() - started:.0f} s, peak memory {peak:.1f} GiB; {throughput(out / METRICS)}")
    _where_it_stood(out, "after")


def speculators_argv(args: argparse.Namespace, meta: dict[str, Any], out: Path) -> list[str]:
    """The flags of ``speculators train`` for this run (see the module docstring for each one that is not a default)."""
    argv = [
        "--speculator-type", "eagle3",
        "--verifier-name-or-path", meta["verifier"],
        "--data-path", str(Path(args.data)),
        "--save-path", str(out / "checkpoints"),
        "--log-dir", str(out / "logs"),
        "--epochs", str(args.epochs),
        "--draft-vocab-size", str(args.draft_vocab_size),
        "--draft-attn-impl", "sdpa",
        "--loss-implementation", "eager",
        "--num-workers", "0",
        "--on-missing", "raise",
        "--train-data-ratio", repr(meta["train_data_ratio"]),
        "--checkpoint-freq", str(CHECKPOINT_FREQ),
        "--target-layer-ids", *(str(layer) for layer in meta["layers"]),
    ]  # fmt: skip
    if args.max_steps:
        argv += ["--max-steps", str(args.max_steps)]
    return argv + list(args.speculators_flags)


def _patch_for_cpu() -> None:
    """The four patches of the module docstring; nothing where torch has an accelerator."""
    import torch
    from speculators.train import checkpointer, cli, trainer

    if torch.accelerator.is_available():
        return
    trainer.get_local_rank = lambda: "cpu"

    class CpuTrainer(trainer.Trainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.device_type = "cpu"  # bf16 autocast on the CPU, not a disabled CUDA autocast

    cli.Trainer = CpuTrainer
    checkpointer.get_current_device = lambda: "cpu"
    torch.accelerator.synchronize = lambda device=None: None


def _log_metrics_to(cli: Any, path: Path) -> None:
    """Every record speculators logs to ``speculators.metrics`` as one JSON line of ``path`` (its configuration of
    that logger, done inside ``main``, would drop a handler added before it)."""
    configure = cli.setup_metric_logger

    class JsonLines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if isinstance(record.msg, dict) and not getattr(record, "hparams", False):
                with path.open("a") as handle:
                    handle.write(json.dumps({"time": record.created, **record.msg}, default=float) + "\n")

    def setup_and_record(*args: Any, **kwargs: Any) -> None:
        configure(*args, **kwargs)
        logging.getLogger("speculators.metrics").addHandler(JsonLines())

    cli.setup_metric_logger = setup_and_record


def throughput(path: Path) -> str:
    """Training tokens and tokens/s over the logged steps (speculators' step timer: fetch, forward, backward, step)."""
    steps = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    profiles = [step["profile"] for step in steps if step.get("profile")]
    if not profiles:
        return "no steps logged"
    seconds = sum(profile["step_ms"] for profile in profiles) / 1000
    tokens = sum(profile["tokens_per_s"] * profile["step_ms"] / 1000 for profile in profiles)
    last = [step for step in steps if "train" in step][-1]
    return (
        f"{len(profiles)} steps logged, {tokens:,.0f} tokens in {seconds:.0f} s of steps: {tokens / seconds:.1f} "
        f"tokens/s; last step {last['global_step']}, loss {last['train']['loss']:.3f}"
    )


def _where_it_stood(out: Path, when: str) -> None:
    states = sorted(p for p in (out / "checkpoints").glob("*/training_state.json") if not p.parent.is_symlink())
    if not states:
        print(f"{when}: no checkpoint in {out / 'checkpoints'}")
        return
    for state in states:
        print(f"{when}: {state}: {state.read_text().strip()}")


# ================================================================================================ score
def score(args: argparse.Namespace) -> None:
    import torch

    from specheads import load_heads
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.training.config import load_config
    from specheads.training.data import build_dataset
    from specheads.training.files import eval_data

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = load_config(args.config, args.overrides)
    base = load_causal_lm(config.model.base, dtype=config.model.dtype)
    tokenizer = load_tokenizer(config.model.tokenizer or config.model.base)
    heldout = build_dataset(eval_data(config.data), tokenizer).with_format("torch")
    results = []
    for directory in map(Path, args.heads):
        result: dict[str, Any] = {"heads": str(directory)}
        source = json.loads((directory / "config.json").read_text())
        if "speculators_model_type" in source:
            name = directory.parent.parent.name if directory.parent.name == "checkpoints" else directory.name
            folded = fold_input_norm(directory, out / f"{name}-folded")
            heads = load_heads(folded, base)
            result.update(folded=str(folded), parity=parity(directory, heads, base, heldout))
            if (directory / "val_metrics.json").is_file():  # speculators' own metrics on the same held-out chats
                result["speculators_val_metrics"] = json.loads((directory / "val_metrics.json").read_text())
        else:
            heads = load_heads(directory, base)
        started = time.perf_counter()
        result.update(heldout_evaluation(config, base, heads, heldout))
        result["eval_seconds"] = round(time.perf_counter() - started, 1)
        results.append(result)
        (out / "score.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "score.md").write_text(table(results))
    print(table(results))


def fold_input_norm(checkpoint: Path, out: Path) -> Path:
    """A copy of the speculators checkpoint with ``norm_before_fc`` folded into ``fc`` (module docstring); a
    checkpoint without it is copied as it is. The verifier-owned tensors speculators saves (embedding, lm_head) stay."""
    from safetensors.torch import load_file, save_file

    config = json.loads((checkpoint / "config.json").read_text())
    tensors = load_file(str(checkpoint / "model.safetensors"))
    if config.get("norm_before_fc"):
        if not config.get("norm_before_residual"):
            sys.exit(f"{checkpoint}: norm_before_fc without norm_before_residual does not fold into fc")
        weight = tensors.pop("input_norm.weight").float()  # [3H]
        tensors["fc.weight"] = tensors["fc.weight"].float() * weight[None, :]  # [H, 3H], float32: one rounding less
        config["norm_before_fc"] = False
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def parity(checkpoint: Path, heads: torch.nn.Module, base: torch.nn.Module, heldout: Any, rows: int = 4) -> dict:
    """One draft step of the imported (folded) heads against speculators' own model on the original checkpoint, both
    in float32 on the same base features, at every position of the first ``rows`` held-out chats: the largest logit
    difference and how often the draft tokens agree (check_speculators_export.py's comparison)."""
    import copy

    import speculators
    import torch

    config = speculators.SpeculatorModelConfig.from_pretrained(str(checkpoint))
    config.transformer_layer_config._attn_implementation = "eager"
    model = speculators.SpeculatorModel.from_pretrained(str(checkpoint), config=config).float().eval()
    captured: dict[str, torch.Tensor] = {}
    hook = model.lm_head.register_forward_hook(lambda module, inputs, output: captured.update(logits=output))
    heads = copy.deepcopy(heads).float()  # loaded in the base's dtype; bf16 would round the comparison away
    max_diff, same, total = 0.0, 0, 0
    try:
        for index in range(min(rows, len(heldout))):
            ids = heldout[index]["input_ids"][None, : int(heldout[index]["attention_mask"].sum())].long()
            with torch.no_grad():
                states = base(ids, output_hidden_states=True).hidden_states
                ours = heads(ids, [states[i].float() for i in heads.hidden_state_layers], steps=1)[1][0]
                features = torch.cat([states[i] for i in config.eagle_aux_hidden_state_layer_ids], -1)[:, :-1]
                model(
                    hidden_states=features.float(),
                    input_ids=ids[:, 1:],
                    document_ids=torch.zeros_like(ids[:, 1:]),
                    position_ids=torch.arange(ids.shape[1] - 1)[None],
                    ttt_steps=1,
                )
            theirs = captured["logits"].float()
            max_diff = max(max_diff, float((theirs - ours).abs().max()))
            same += int((theirs.argmax(-1) == ours.argmax(-1)).sum())
            total += ours.shape[1]
    finally:
        hook.remove()
    return {"rows": rows, "positions": total, "max_logit_diff": max_diff, "same_draft_token": same / max(total, 1)}


def heldout_evaluation(config: Any, base: torch.nn.Module, heads: torch.nn.Module, heldout: Any) -> dict[str, Any]:
    """The trainer's held-out evaluation (specheads.training.heldout.evaluate) of ``heads``, outside a run."""
    import torch

    from specheads.registry import HEAD_TYPES
    from specheads.training.batches import collate_trimmed
    from specheads.training.evaluate import simulated_tau

    loader = torch.utils.data.DataLoader(heldout, batch_size=config.train.batch_size, collate_fn=collate_trimmed)
    heads.eval()
    result = HEAD_TYPES[config.heads.type].evaluate_fn()(base, heads, loader, max_batches=config.data.eval_batches)
    result["simulated_tau"] = simulated_tau(result["agreement_by_rank"])
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| heads | agreement by depth 1-5 | chain-3 tau | tree-6 tau | tree-16 tau | positions | parity |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        agreement = " ".join(f"{a:.3f}" for a in result["agreement_with_base_greedy"])
        tau = result["simulated_tau"]
        check = result.get("parity")
        same = f"{check['same_draft_token']:.3f} same, max diff {check['max_logit_diff']:.1e}" if check else ""
        lines.append(
            f"| {result['heads']} | {agreement} | {tau['chain-3']:.2f} | {tau['tree-6']:.2f} | {tau['tree-16']:.2f} "
            f"| {result['positions'][0]} | {same} |"
        )
    return "\n".join(lines) + "\n"


# ================================================================================================ CLI
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")

    converting = commands.add_parser("convert", parents=[common], help="speculators' offline data from the cache")
    converting.add_argument("--config", default=CONFIG, help=f"the recipe (default {CONFIG})")
    converting.add_argument("--records", type=int, default=3700, help="the recipe's data.limit (default 3700)")
    converting.add_argument("--cache", default="runs/ab-features", help="the feature cache (read only)")
    converting.add_argument("--out", required=True, help="the data folder to write (e.g. runs/peer/data-3700)")
    converting.add_argument("overrides", nargs="*", help="key=value recipe overrides")

    training = commands.add_parser("train", parents=[common], help="speculators' trainer on a converted folder")
    training.add_argument("--data", required=True, help="a folder written by convert")
    training.add_argument("--out", required=True, help="checkpoints, metrics and logs go here")
    training.add_argument("--epochs", type=int, default=1, help="(default 1: the A/B's one pass)")
    training.add_argument("--draft-vocab-size", type=int, default=DRAFT_VOCAB, help=f"(default {DRAFT_VOCAB})")
    training.add_argument("--max-steps", type=int, help="stop after this many steps (a short proof run)")
    training.add_argument(
        "speculators_flags", nargs=argparse.REMAINDER, help="after --: more `speculators train` flags, as given"
    )

    scoring = commands.add_parser("score", parents=[common], help="held-out agreement and tau of heads")
    scoring.add_argument("--heads", action="append", required=True, help="a head folder (repeatable)")
    scoring.add_argument("--config", default=CONFIG, help=f"the recipe whose held-out set is used (default {CONFIG})")
    scoring.add_argument("--out", required=True, help="score.json, score.md and folded checkpoints go here")
    scoring.add_argument("overrides", nargs="*", help="key=value recipe overrides")

    args = parser.parse_args(argv)
    if args.command == "train" and args.speculators_flags[:1] == ["--"]:
        args.speculators_flags = args.speculators_flags[1:]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    {"convert": convert, "train": train, "score": score}[args.command](args)


if __name__ == "__main__":
    main()
