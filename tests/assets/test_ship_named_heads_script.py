"""scripts/ship_named_heads.py: the commands a manifest records reproduce heads trained in stages on grown data."""

from __future__ import annotations

from pathlib import Path

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
    commands = script._commands("qwen2.5-coder-1.5b", Path("runs/q"), recipe, "c.yaml", dtypes=["bfloat16", "float32"])
    assert commands == [
        "specheads train --config c.yaml",
        "specheads calibrate --config c.yaml --heads runs/q/heads --dtype bfloat16",
        "specheads calibrate --config c.yaml --heads runs/q/heads --dtype float32",
        "python scripts/ship_named_heads.py qwen2.5-coder-1.5b runs/q --config c.yaml",
    ]


def test_code_heads_ship_the_files_they_trained_on_with_their_hashes(tmp_path: Path) -> None:
    import json

    script = load_script("ship_named_heads")
    cache = tmp_path / "cache"
    cache.mkdir()

    def file(name: str, split: str) -> dict:
        return {"path": f"/usr/lib/{name}", "entry": "python-stdlib", "relpath": name, "bytes": len(name),
                "sha256": name * 2, "split": split}  # fmt: skip

    files = [file("a.py", "train"), file("h.py", "heldout"), file("b.py", "train"), file("c.py", "train")]
    leaks = [{"path": "/usr/lib/leak.py", "set": "humaneval"}]
    recorded = {"settings": {"paths": ["python-stdlib"]}, "summary": "4 files", "skipped": {"empty": 1},
                "leaks": leaks, "files": files}  # fmt: skip
    (cache / "data_files.json").write_text(json.dumps(recorded))
    recipe = {"data": {"paths": ["python-stdlib"], "format": "code", "limit": 2, "feature_cache": str(cache)}}
    listing = script._code_files(recipe)
    # the first data.limit training files in corpus order, then every held-out file; no machine paths
    assert [(f["relpath"], f["split"], f["sha256"]) for f in listing["files"]] == [
        ("a.py", "train", "a.pya.py"),
        ("b.py", "train", "b.pyb.py"),
        ("h.py", "heldout", "h.pyh.py"),
    ]
    assert "path" not in listing["files"][0] and listing["leaks"] == [{"path": "leak.py", "set": "humaneval"}]
    assert listing["skipped"] == {"empty": 1}
    facts = script._corpus_facts(listing, "eagle3")
    assert (facts["train_files"], facts["heldout_files"], facts["train_bytes"]) == (2, 1, 8)
    assert script._code_files({"data": {"paths": ["d.jsonl"], "format": "sharegpt"}}) is None
    (cache / "data_files.json").unlink()
    try:
        script._code_files(recipe)
    except SystemExit as error:
        assert "corpus manifest" in str(error)
    else:
        raise AssertionError("a code recipe without its corpus manifest was shipped")


def test_without_a_curve_file_the_runs_own_evaluations_are_its_learning_curve(tmp_path: Path) -> None:
    script = load_script("ship_named_heads")
    assert script._evals(tmp_path) is None
    (tmp_path / "evals.jsonl").write_text('{"step": 50, "tokens_seen": 1}\n\n{"step": 100, "tokens_seen": 2}\n')
    assert [point["step"] for point in script._evals(tmp_path)] == [50, 100]
