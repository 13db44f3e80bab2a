"""scripts/ship_named_heads.py: the commands a manifest records reproduce heads trained in stages on grown data."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import load_script


def _recipe(paths: list[str]) -> dict:
    return {"data": {"paths": paths, "eval_paths": ["data/x/heldout.jsonl"]}, "output": {"dir": "runs/continued"}}


def test_a_continued_run_on_grown_data_records_every_stage_in_order() -> None:
    script = load_script("ship_named_heads")
    commands = script._commands(
        "smollm2-135m",  # its answers are kept in the repository: the chats are unpacked, not distilled again
        Path("runs/continued"),
        _recipe(["data/smollm2-135m/distilled-after-7849.jsonl"]),
        "configs/continue.yaml",
        stages=["configs/first.yaml"],
        turns=2,
    )
    turns = "data/smollm2-135m/sharegpt_turns2.jsonl"
    assert commands[1].startswith(f"python scripts/sharegpt_prompts.py --turns 2 --out {turns} --heldout 160")
    unpack = next(c for c in commands if "unpack data/smollm2-135m/responses" in c)
    assert (
        f"--prompts data/smollm2-135m/sharegpt_prompts.jsonl {turns} data/smollm2-135m/heldout_prompts.jsonl" in unpack
    )
    tail = "tail -n +7850 data/smollm2-135m/distilled.jsonl > data/smollm2-135m/distilled-after-7849.jsonl"
    trains = [c for c in commands if c.startswith("specheads train")]
    assert trains == ["specheads train --config configs/first.yaml", "specheads train --config configs/continue.yaml"]
    assert commands.index(tail) < commands.index(trains[0])
    assert commands[-1].endswith("--config configs/continue.yaml --stage configs/first.yaml --turns 2")


def test_without_kept_answers_the_conversations_are_distilled_turn_by_turn_after_the_first_turns() -> None:
    script = load_script("ship_named_heads")
    commands = script._commands("other", Path("runs/x"), _recipe(["data/other/distilled-500.jsonl"]), "c.yaml", [], 2)
    distills = [c for c in commands if c.startswith("specheads distill")]
    assert [("--all-turns" in c, c.split("--prompts ")[1].split()[0]) for c in distills] == [
        (False, "data/other/sharegpt_prompts.jsonl"),
        (True, "data/other/sharegpt_turns2.jsonl"),
    ]
    assert "head -n 500 data/other/distilled.jsonl > data/other/distilled-500.jsonl" in commands
    assert commands[-3:-1] == [
        "specheads train --config c.yaml output.dir=runs/x",
        "specheads calibrate --config c.yaml --heads runs/x/heads",
    ]


def test_settings_the_run_took_from_its_command_line_are_repeated_on_its_train_command(tmp_path: Path) -> None:
    from specheads.training.config import load_config

    script = load_script("ship_named_heads")
    config = tmp_path / "recipe.yaml"
    config.write_text("data:\n  paths: [data/x/distilled.jsonl]\n  limit: 3700\ntrain:\n  lr: 1.0e-3\n")
    trained = load_config(
        config, ["data.limit=null", "train.lr=2e-3", "output.dir=runs/full", "data.feature_cache=runs/elsewhere"]
    ).to_dict()
    overrides = script._overrides(trained, str(config))
    assert overrides == ["data.limit=null", "train.lr=0.002"]  # where files go is not a setting of the heads
    assert script._overrides(load_config(config).to_dict(), str(config)) == []
    assert script._overrides(trained, str(tmp_path / "gone.yaml")) == []
    commands = script._commands("other", Path("runs/full"), trained, str(config), overrides=overrides)
    # the file writes elsewhere (its default output.dir): the command sends the run where the later commands look
    assert f"specheads train --config {config} data.limit=null train.lr=0.002 output.dir=runs/full" in commands


def test_a_variant_records_the_command_that_ships_it_beside_the_default() -> None:
    script = load_script("ship_named_heads")
    commands = script._commands("other", Path("runs/x"), _recipe(["data/other/distilled-500.jsonl"]), "c.yaml")
    assert "--variant" not in commands[-1]
    commands = script._commands(
        "other", Path("runs/x"), _recipe(["data/other/distilled-500.jsonl"]), "c.yaml", variant="llamacpp"
    )
    assert commands[-1].endswith("--config c.yaml --variant llamacpp")


def test_a_code_recipe_distills_nothing_and_records_a_calibration_per_dtype() -> None:
    script = load_script("ship_named_heads")
    recipe = {"data": {"paths": ["python-stdlib"], "format": "code"}, "output": {"dir": "runs/q"}}
    both = dict.fromkeys(["bfloat16", "float32"])  # no record holds its options: the commands name the dtype only
    commands = script._commands("qwen2.5-coder-1.5b", Path("runs/q"), recipe, "c.yaml", calibrations=both)
    assert commands == [
        "specheads train --config c.yaml",
        "specheads calibrate --config c.yaml --heads runs/q/heads --dtype bfloat16",
        "specheads calibrate --config c.yaml --heads runs/q/heads --dtype float32",
        "python scripts/ship_named_heads.py qwen2.5-coder-1.5b runs/q --config c.yaml",
    ]
    options = "--batches 3 --max-nodes 16"  # what calibration ran with is part of its command
    one = {"bfloat16": None}
    commands = script._commands("x", Path("runs/q"), recipe, "c.yaml", calibrations=one, calibrate_options=options)
    # one dtype is named too: without it, a CPU without bf16 units would calibrate float32 instead
    assert commands[1] == f"specheads calibrate --config c.yaml --heads runs/q/heads --dtype bfloat16 {options}"
    # the options a record of tree.json holds win; --calibrate-options stands in for records without them
    recorded = {"bfloat16": "--threads 2 --batches 2", "float32": None}
    commands = script._commands(
        "x", Path("runs/q"), recipe, "c.yaml", calibrations=recorded, calibrate_options=options,
    )  # fmt: skip
    assert commands[1:3] == [
        "specheads calibrate --config c.yaml --heads runs/q/heads --dtype bfloat16 --threads 2 --batches 2",
        f"specheads calibrate --config c.yaml --heads runs/q/heads --dtype float32 {options}",
    ]


def test_code_heads_ship_the_files_they_trained_on_with_their_hashes(tmp_path: Path) -> None:
    import hashlib

    from specheads.training.code_corpus import code_corpus
    from specheads.training.config import DataConfig

    script = load_script("ship_named_heads")
    folder = tmp_path / "src"
    for index in range(40):
        path = folder / "pkg" / f"mod{index:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE{index:02d} = {100 + index}\n\ndef f{index:02d}(x):\n    return x * {index + 3}\n")
    (folder / "pkg" / "empty.py").write_text("")
    data = {"paths": [str(folder)], "format": "code", "limit": 3, "heldout_fraction": 0.2,
            "feature_cache": str(tmp_path / "cache")}  # fmt: skip
    corpus = code_corpus(DataConfig(**data))  # writes data_files.json into the feature cache folder
    recipe = {"data": data}
    listing = script._code_files(recipe)
    train = [file for file in corpus.files if file.split == "train"][:3]
    heldout = [file for file in corpus.files if file.split == "heldout"]
    assert heldout and len(train) == 3
    # the first data.limit training files in corpus order, then every held-out file; no machine paths
    assert [(f["relpath"], f["split"]) for f in listing["files"]] == [(f.relpath, f.split) for f in train + heldout]
    first = listing["files"][0]
    assert "path" not in first and first["entry"] == str(folder)
    assert first["sha256"] == hashlib.sha256((folder / first["relpath"]).read_bytes()).hexdigest()
    assert sum(listing["skipped"].values()) == 1  # the empty file
    facts = script._corpus_facts(listing, "eagle3")
    assert (facts["train_files"], facts["heldout_files"]) == (3, len(heldout))
    assert facts["train_bytes"] == sum(file.bytes for file in train)
    assert script._code_files({"data": {"paths": ["d.jsonl"], "format": "sharegpt"}}) is None
    # a file changed since the run: the listing would not be what the heads saw
    (folder / heldout[0].relpath).write_text("changed = True\n")
    with pytest.raises(SystemExit, match="changed since"):
        script._code_files(recipe)
    (tmp_path / "cache" / "data_files.json").unlink()
    with pytest.raises(SystemExit, match="corpus manifest"):
        script._code_files(recipe)


def test_without_a_curve_file_the_runs_own_evaluations_are_its_learning_curve(tmp_path: Path) -> None:
    script = load_script("ship_named_heads")
    assert script._evals(tmp_path) is None
    (tmp_path / "evals.jsonl").write_text('{"step": 50, "tokens_seen": 1}\n\n{"step": 100, "tokens_seen": 2}\n')
    assert [point["step"] for point in script._evals(tmp_path)] == [50, 100]
