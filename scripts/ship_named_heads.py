"""Ship trained EAGLE-3 heads for a named real base (``heads="default"`` with ``base="smollm2-135m"``).

    specheads train --config configs/smollm2-135m/eagle3-large.yaml
    specheads calibrate --config configs/smollm2-135m/eagle3-large.yaml --heads runs/smollm2-135m-eagle3-large/heads
    python scripts/ship_named_heads.py smollm2-135m runs/smollm2-135m-eagle3-large \
        --config configs/smollm2-135m/eagle3-large.yaml --training training.json --curve curve.json

``--variant NAME`` ships them beside the default heads instead (``specheads/assets/<name>/eagle3-NAME``, loaded with
``heads="default:NAME"``; ``llamacpp`` is the set llama.cpp's checks and exports use where the default cannot run
there); the manifest keeps every other shipped set.

Heads continued from an earlier run (``train.init_from``) name the earlier recipes with ``--stage``, and ``--turns N``
says the distillation grew to conversations of N turns.

Copies the head checkpoint of ``RUN/heads`` (config.json, the weights as bfloat16 safetensors, the calibrated
tree.json, eval.json and recipe.json) into ``specheads/assets/<name>/eagle3/`` and writes
``specheads/assets/<name>/manifest.json``: the base (package, file, sha256), the recipe and its data, the tokens the
heads saw (from the run's checkpoint state), the held-out agreement, the learning curve (``--curve``: the
``curve.json`` of ``scripts/learning_curve.py``; else the run's own ``evals.jsonl``), the calibration, the commands
and the sha256 of every shipped file, checked whenever the heads are loaded.

Heads trained on source files (``data.format: code``) ship ``data_files.json`` beside them: every file they trained
on and the held-out files, each with its sha256, read through the run's corpus manifest (which rechecks every hash),
and what the corpus skipped and dropped as a leak. Settings the run took from the command line (``data.limit=null``)
are found by comparing the run's recipe with ``--config`` and written into the recorded train command; heads
calibrated for several dtypes record a calibrate command for each, with the options calibration recorded in its
record of ``tree.json`` (``--calibrate-options`` for records written before it did). Refuses heads that do not
load on the base and heads over the base's size limit (20 MB; 64 MB for Qwen2.5-Coder-1.5B's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "specheads" / "assets"
FILES = ("config.json", "model.safetensors", "tree.json", "eval.json", "recipe.json")
DATA_FILES = "data_files.json"  # a code recipe's files, shipped beside its heads
MAX_HEADS_BYTES = 20 * 10**6
CALIBRATION_KEYS = ("choices", "dynamic", "expected_tau", "plain_tokens_per_s", "best_speedup_over_plain")
MAX_HEADS_BYTES_BY_BASE = {"qwen2.5-coder-1.5b": 64 * 10**6}  # a 1536-wide head with its own draft lm_head
# Settings that do not change the heads a run produces: where files go, logging, caching, resuming.
NEUTRAL_SETTINGS = {
    "output.dir", "output.save_every", "log.tracker", "log.every", "data.feature_cache", "data.cache",
    "data.cache_dir", "data.num_proc", "train.resume", "train.overwrite", "train.max_minutes", "model.dtype",
    "train.mixed_precision",
}  # fmt: skip


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _overrides(recipe: dict, config: str) -> list[str]:
    """``key=value`` for every setting where the run's recipe differs from the recipe file it was started with,
    except ``NEUTRAL_SETTINGS``; nothing when the file is gone."""
    if not Path(config).is_file():
        return []
    from specheads.training.config import load_config

    def leaves(section: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in section.items():
            if isinstance(value, dict):
                out |= leaves(value, f"{prefix}{key}.")
            else:
                out[prefix + key] = value
        return out

    trained, written = leaves(recipe), leaves(load_config(config).to_dict())

    def setting(key: str, value: object) -> str:
        return shlex.quote(f"{key}={value if isinstance(value, str) else json.dumps(value)}")

    return [
        setting(key, value)
        for key, value in trained.items()
        if key not in NEUTRAL_SETTINGS and key in written and written[key] != value
    ]


def _written_output_dir(recipe: dict, config: str) -> str | None:
    """Where ``specheads train --config CONFIG`` writes: the recipe file's ``output.dir`` (the run's own recipe when
    the file is gone)."""
    if Path(config).is_file():
        from specheads.training.config import load_config

        return load_config(config).output.dir
    return recipe.get("output", {}).get("dir")


def _commands(
    name: str,
    run: Path,
    recipe: dict,
    config: str,
    stages: Sequence[str] = (),
    turns: int = 1,
    overrides: Sequence[str] = (),
    variant: str | None = None,
    calibrations: Mapping[str, str | None] | None = None,
    calibrate_options: str = "",
) -> list[str]:
    """The commands that reproduce the shipped heads, from the recipe they were trained with: the distilled chats
    (rebuilt from the answers kept in ``data/<name>/responses`` where the repository holds them, else distilled
    again; a prefix of the distillation's output when the recipe names ``distilled-N.jsonl``, what follows its first N
    records for ``distilled-after-N.jsonl``), the training runs (``stages``: recipes trained before this one, whose
    heads it continues through ``train.init_from``; with its output folder when it is not the recipe file's),
    calibration and this script. ``turns`` > 1: the distillation grew from first turns to conversations of that many
    turns (``sharegpt_prompts.py --turns``), whose prompts file the rebuild reads too. ``overrides``: settings the
    last run took from its command line (``_overrides``), repeated on its train command; ``variant``: shipped beside
    the default heads; ``calibrations``: the dtypes the heads were calibrated for, one calibrate command each (the
    dtype named), with the arguments its record holds
    (:func:`specheads.heads.calibration.calibrate_arguments`), else, where that is None (records written before
    calibration recorded its options), ``calibrate_options``. A code
    recipe (``data.format: code``) reads source files already on the machine: nothing is distilled."""
    if recipe.get("data", {}).get("format") == "code":
        commands: list[str] = []
    else:
        commands = _distill_commands(name, recipe, turns)
    train = " ".join([f"specheads train --config {config}", *overrides])
    if _written_output_dir(recipe, config) not in (None, str(run)):
        train += f" output.dir={run}"
    calibrate = f"specheads calibrate --config {config} --heads {run}/heads"

    def options(recorded: str | None) -> str:
        chosen = recorded or calibrate_options.strip()
        return f" {chosen}" if chosen else ""

    return [
        *commands,
        *(f"specheads train --config {stage}" for stage in stages),
        train,
        *(
            [f"{calibrate} --dtype {dtype}{options(recorded)}" for dtype, recorded in (calibrations or {}).items()]
            or [calibrate + options(None)]
        ),
        f"python scripts/ship_named_heads.py {name} {run} --config {config}"
        + "".join(f" --stage {stage}" for stage in stages)
        + (f" --turns {turns}" if turns > 1 else "")
        + (f" --variant {variant}" if variant else ""),
    ]


def _distill_commands(name: str, recipe: dict, turns: int = 1) -> list[str]:
    """The commands that rebuild a chat recipe's distilled data (see ``_commands``)."""
    distilled = f"data/{name}/distilled.jsonl"
    prompts = f"data/{name}/sharegpt_prompts.jsonl"
    eval_paths = recipe.get("data", {}).get("eval_paths") or []
    heldout = f" --heldout 160 --heldout-out data/{name}/heldout_prompts.jsonl" if eval_paths else ""
    commands = [f"python scripts/sharegpt_prompts.py --out {prompts}{heldout}"]
    if turns > 1:
        conversations = f"data/{name}/sharegpt_turns{turns}.jsonl"
        commands.append(f"python scripts/sharegpt_prompts.py --turns {turns} --out {conversations}{heldout}")
        prompts = f"{prompts} {conversations}"
    kept = ASSETS.parents[1] / "data" / name / "responses"
    if kept.is_dir():
        every = f"{prompts} data/{name}/heldout_prompts.jsonl" if eval_paths else prompts
        commands.append(f"python scripts/distilled_shards.py unpack data/{name}/responses --base {name} "
                        f"--prompts {every} --out {distilled}")  # fmt: skip
        if eval_paths and (kept.parent / "heldout-responses").is_dir():
            commands.append(f"python scripts/distilled_shards.py unpack data/{name}/heldout-responses --base {name} "
                            f"--prompts {every} --out {eval_paths[0]}")  # fmt: skip
    else:
        for file in prompts.split():
            all_turns = " --all-turns" if file != prompts.split()[0] else ""
            distill = f"specheads distill --base {name} --prompts {file}{all_turns} --out {distilled}"
            commands.append(f"{distill} --max-new-tokens 256 --batch-size 32")
    for path in recipe.get("data", {}).get("paths") or []:
        stem = Path(path).stem.removeprefix("distilled-")
        if stem.isdigit():
            commands.append(f"head -n {stem} {distilled} > {path}")
        elif stem.startswith("after-") and stem.removeprefix("after-").isdigit():
            commands.append(f"tail -n +{int(stem.removeprefix('after-')) + 1} {distilled} > {path}")
    return commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="the named base, e.g. smollm2-135m")
    parser.add_argument("run", type=Path, help="the training run's output.dir (its heads/ are shipped)")
    parser.add_argument("--training", type=Path, help="JSON with further training facts to record (minutes, load)")
    parser.add_argument("--config", help="the recipe the run trained with (default: configs/NAME/eagle3.yaml)")
    parser.add_argument("--curve", type=Path, help="learning_curve.py's curve.json to record with the heads")
    parser.add_argument(
        "--stage",
        action="append",
        default=[],
        help="a recipe trained before --config, whose heads it continues (train.init_from); repeat, in order",
    )
    parser.add_argument(
        "--turns", type=int, default=1, help="the distillation grew to conversations of this many turns"
    )
    parser.add_argument("--variant", help="ship beside the default heads as heads='default:VARIANT' (e.g. llamacpp)")
    parser.add_argument(
        "--calibrate-options",
        default="",
        help="the options specheads calibrate ran with, for tree.json records that do not hold them "
        "(e.g. '--batches 3 --max-nodes 16')",
    )
    args = parser.parse_args(argv)
    recipe_path = args.config or f"configs/{args.name}/eagle3.yaml"

    import torch
    from safetensors.torch import load_file, save_file

    from specheads import assets
    from specheads.gguf import file_sha256
    from specheads.heads import EagleHead, load_heads
    from specheads.heads.calibration import calibrate_arguments
    from specheads.loading import load_causal_lm

    heads_dir = args.run / "heads"
    heads = load_heads(heads_dir, load_causal_lm(args.name))  # refuses heads made for another base
    if not isinstance(heads, EagleHead) or heads.config.version != 3:
        raise SystemExit(f"{heads_dir} holds no EAGLE-3 head")
    missing = [name for name in FILES[:3] if not (heads_dir / name).is_file()]
    if missing:
        raise SystemExit(f"{heads_dir} lacks {missing}: train, then run specheads calibrate on it first")
    key = "eagle3" if args.variant is None else f"eagle3-{args.variant}"
    target = ASSETS / args.name / key
    staging = target.with_name(f".{key}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in FILES:
        if name not in ("model.safetensors", "config.json") and (heads_dir / name).is_file():
            shutil.copy2(heads_dir / name, staging / name)
    config = json.loads((heads_dir / "config.json").read_text())
    config["base_model"]["name_or_path"] = args.name  # not this machine's cache folder; the fingerprint binds
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = load_file(str(heads_dir / "model.safetensors"))
    bf16 = {key: value.to(torch.bfloat16) if value.is_floating_point() else value for key, value in weights.items()}
    save_file(bf16, str(staging / "model.safetensors"), metadata={"format": "pt"})
    corpus = _code_files(json.loads((heads_dir / "recipe.json").read_text()) if (heads_dir / "recipe.json").is_file()
                         else {})  # fmt: skip
    if corpus is not None:
        (staging / DATA_FILES).write_text(json.dumps(corpus, indent=1) + "\n")
    for path in staging.iterdir():
        path.chmod(0o644)
    size = sum(path.stat().st_size for path in staging.iterdir())
    limit = MAX_HEADS_BYTES_BY_BASE.get(args.name, MAX_HEADS_BYTES)
    if size > limit:
        shutil.rmtree(staging)
        raise SystemExit(f"the heads are {size / 1e6:.2f} MB, over the {limit / 1e6:.0f} MB limit for {args.name}")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)

    named = assets.NAMED_BASES[args.name]
    gguf = assets.named_gguf(args.name)
    recipe = json.loads((target / "recipe.json").read_text()) if (target / "recipe.json").is_file() else {}
    evaluation = json.loads((target / "eval.json").read_text()) if (target / "eval.json").is_file() else {}
    tree = json.loads((target / "tree.json").read_text())
    root = ASSETS / args.name
    previous = json.loads((root / "manifest.json").read_text()) if (root / "manifest.json").is_file() else {}
    manifest = {
        "name": args.name,
        "base": {"package": named.requirement, "file": named.filename, "sha256": file_sha256(gguf)},
        "heads": {
            **{name: entry for name, entry in previous.get("heads", {}).items() if (root / entry["path"]).is_dir()},
            key: {
                "path": key,
                "parameters": sum(p.numel() for p in heads.parameters()),
                "dtype": "bfloat16",
                "recipe": recipe,
                "data": recipe.get("data", {}).get("paths"),
                **({"data_files": _corpus_facts(corpus, key)} if corpus is not None else {}),
                "training": _run_facts(args.run) | (json.loads(args.training.read_text()) if args.training else {}),
                "heldout_agreement_with_base_greedy_by_depth": evaluation.get("agreement_with_base_greedy"),
                "calibrated": {
                    dtype: {key: record.get(key) for key in CALIBRATION_KEYS}
                    for dtype, record in (tree.get("by_dtype") or {tree.get("dtype", "unknown"): tree}).items()
                }
                | {"machine": tree.get("machine")},
                "learning_curve": json.loads(args.curve.read_text())["points"] if args.curve else _evals(args.run),
                "stages": [_stage_facts(stage) for stage in args.stage],
                "commands": _commands(
                    args.name,
                    args.run,
                    recipe,
                    recipe_path,
                    args.stage,
                    args.turns,
                    _overrides(recipe, recipe_path),
                    args.variant,
                    {
                        dtype.split("/")[0]: calibrate_arguments(record)
                        for dtype, record in sorted((tree.get("by_dtype") or {}).items())
                    },
                    args.calibrate_options,
                ),
            },
        },
    }
    manifest["files"] = {
        path.relative_to(root).as_posix(): sha256_file(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != "manifest.json"
    }
    temporary = root / "manifest.json.tmp"
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    temporary.replace(root / "manifest.json")
    print(f"shipped {target} ({size / 1e6:.2f} MB)")
    return 0


def _code_files(recipe: dict) -> dict | None:
    """The files a code recipe (``data.format: code``) trained and was evaluated on, read through its corpus manifest
    (which checks that the settings match and that every file's sha256 is unchanged): the first ``data.limit``
    training files in corpus order and every held-out file, with their sha256, size and the data.paths entry they
    came from; None for other recipes.

    Raises:
        SystemExit: the recipe reads source files but its corpus manifest is not on this machine, was written with
            other settings, or one of its files changed since.
    """
    data = recipe.get("data", {})
    if data.get("format") != "code":
        return None
    from specheads.training.code_corpus import corpus_settings, manifest_path, read_manifest
    from specheads.training.config import DataConfig
    from specheads.training.errors import DataError

    config = DataConfig(**{k: v for k, v in data.items() if k in DataConfig.__dataclass_fields__})
    manifest = manifest_path(config)
    if manifest is None or not manifest.is_file():
        raise SystemExit(f"the heads were trained on source files, but their corpus manifest ({manifest}) is missing")
    try:
        corpus = read_manifest(manifest, corpus_settings(config))
        files = corpus.split_files("train")[: config.limit] + corpus.split_files("heldout")
    except DataError as error:
        raise SystemExit(f"cannot list the files the heads were trained on: {error}") from error
    keys = ("entry", "relpath", "bytes", "sha256", "split")
    return {
        "settings": corpus.settings,
        "python": sys.version.split()[0],
        "corpus": corpus.summary(),
        "skipped": dict(sorted(corpus.skipped.items())),
        "leaks": [{**leak, "path": Path(leak["path"]).name} for leak in corpus.leaks],
        "files": [{key: getattr(file, key) for key in keys} for file in files],
    }


def _corpus_facts(corpus: dict, key: str) -> dict:
    files = corpus["files"]
    return {
        "listing": f"{key}/{DATA_FILES}",
        "train_files": sum(file["split"] == "train" for file in files),
        "heldout_files": sum(file["split"] == "heldout" for file in files),
        "train_bytes": sum(file["bytes"] for file in files if file["split"] == "train"),
        "python": corpus["python"],
    }


def _stage_facts(config: str) -> dict:
    """An earlier stage of the shipped heads: its recipe file, and its run's steps, tokens and held-out agreement."""
    import yaml

    output = Path(yaml.safe_load(Path(config).read_text())["output"]["dir"])
    evaluation = output / "heads" / "eval.json"
    agreement = json.loads(evaluation.read_text()).get("agreement_with_base_greedy") if evaluation.is_file() else None
    return {"config": config, "training": _run_facts(output), "heldout_agreement_with_base_greedy_by_depth": agreement}


def _evals(run: Path) -> list[dict] | None:
    """The held-out evaluations the run recorded as it trained (``evals.jsonl``): its learning curve; None without."""
    path = run / "evals.jsonl"
    if not path.is_file():
        return None
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_facts(run: Path) -> dict:
    """Steps and tokens from the run's last checkpoint state, when it recorded them."""
    final = run / "final_state.json"
    facts = json.loads(final.read_text()) if final.is_file() else {}
    keys = ("step", "total_steps", "tokens_seen", "targets_seen", "world_size")
    return {key: facts[key] for key in keys if key in facts}


if __name__ == "__main__":
    sys.exit(main())
