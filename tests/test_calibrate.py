"""Tree calibration: greedy growth by path probability, and the size trade-off against the measured cost."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import greedy_reference, tiny_model, tiny_tokenizer

from specheads import SpecDecoder
from specheads.calibrate import choose_tree, grow_tree, measure_verify_cost
from specheads.heads import MedusaHeads, load_heads

AGREEMENT = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.1, 0.05]]


def test_growth_adds_the_most_probable_node_first() -> None:
    nodes = grow_tree(AGREEMENT, max_nodes=5)
    paths = [path for path, _ in nodes]
    # 0.6, then 0.6*0.5=0.30, then 0.2, then 0.6*0.5*0.4=0.12, then 0.6*0.2=0.12 (ties: heap order by path)
    assert paths[:3] == [(0,), (0, 0), (1,)]
    assert set(paths[3:]) <= {(0, 0, 0), (0, 1), (2,), (1, 0)}
    probabilities = [p for _, p in nodes]
    assert probabilities == sorted(probabilities, reverse=True)
    for path in paths:  # every prefix is a valid tree: parents come before children
        assert len(path) == 1 or path[:-1] in paths[: paths.index(path)]


def test_a_free_verifier_takes_the_largest_tree_and_a_linear_one_a_small_tree() -> None:
    flat = choose_tree(AGREEMENT, {1: 10.0, 64: 10.0}, max_nodes=20)
    assert len(flat.choices) == 20
    linear = choose_tree(AGREEMENT, {1: 10.0, 64: 640.0}, max_nodes=20)
    assert len(linear.choices) <= 1  # each extra node costs a whole forward: speculation barely pays
    middle = choose_tree(AGREEMENT, {1: 10.0, 4: 11.0, 16: 20.0, 64: 80.0}, max_nodes=40)
    assert 1 < len(middle.choices) < 40
    expected_tau = 1 + sum(p for _, p in grow_tree(AGREEMENT, len(middle.choices)))
    assert middle.expected_tau == pytest.approx(expected_tau)


def test_measure_verify_cost_returns_positive_times() -> None:
    timings = measure_verify_cost(tiny_model("llama"), prefix_len=16, sizes=(1, 4), repeats=2)
    assert set(timings) == {1, 4} and all(t > 0 for t in timings.values())


def test_calibrate_command_writes_an_auto_tree_that_decodes_losslessly(tmp_path) -> None:
    from specheads.cli import main

    base = tiny_model("llama", seed=1)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    MedusaHeads.from_base(base, num_heads=3).save_pretrained(tmp_path / "heads")
    (tmp_path / "data.txt").write_text("def f(x):\n    return x * 2\n" * 40)
    assert (
        main(
            [
                "calibrate",
                "--base",
                str(tmp_path / "base"),
                "--heads",
                str(tmp_path / "heads"),
                "--data",
                str(tmp_path / "data.txt"),
                "--max-length",
                "64",
                "--batches",
                "2",
                "--max-nodes",
                "12",
                "--new-tokens",
                "6",
            ]
        )
        == 0
    )
    record = json.loads((tmp_path / "heads" / "tree.json").read_text())
    heads = load_heads(tmp_path / "heads", base)
    assert heads.calibration.tree == record["choices"]
    decoder = SpecDecoder.from_pretrained(base, heads=str(tmp_path / "heads"))
    prompt = torch.tensor([[5, 6, 7, 8]])
    out = decoder.generate(prompt, max_new_tokens=12, tree="auto")  # an empty tree decodes plainly
    assert torch.equal(out.sequences, greedy_reference(base, prompt, 12))
    assert max(out.stats.drafted_depths) == max((len(path) for path in record["choices"]), default=0)


def test_auto_tree_without_calibration_is_a_clear_error(tmp_path) -> None:
    base = tiny_model("llama", seed=1)
    MedusaHeads.from_base(base, num_heads=2).save_pretrained(tmp_path)
    decoder = SpecDecoder.from_pretrained(base, heads=str(tmp_path))
    with pytest.raises(ValueError, match="specheads calibrate"):
        decoder.generate(torch.tensor([[3, 4]]), max_new_tokens=3, tree="auto")
    with pytest.raises(ValueError, match="calibrated for draft heads"):
        SpecDecoder(base).generate(torch.tensor([[3, 4]]), max_new_tokens=3, tree="auto")


def test_calibrate_eagle_heads_writes_a_static_tree_and_dynamic_parameters(tmp_path, capsys) -> None:
    from specheads.cli import main
    from specheads.heads import EagleHead

    base = tiny_model("llama", seed=1, layers=4)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    EagleHead.from_base(base, version=3).save_pretrained(tmp_path / "heads")
    (tmp_path / "data.txt").write_text("def f(x):\n    return x * 2\n" * 40)
    args = ["calibrate", "--base", str(tmp_path / "base"), "--heads", str(tmp_path / "heads")]
    args += ["--data", str(tmp_path / "data.txt"), "--max-length", "64", "--batches", "2", "--new-tokens", "6"]
    assert main([*args, "--max-nodes", "8"]) == 0
    record = json.loads((tmp_path / "heads" / "tree.json").read_text())
    assert set(record["dynamic"]) == {"top_k", "depth", "total_tokens"} and record["draft_ms_per_level"] > 0
    assert f"EAGLE-2 dynamic tree for this machine: {record['dynamic']}" in capsys.readouterr().out
    timed = [row["tree"] for row in record["measured"]]
    assert record["choices"] in timed and record["dynamic"] in timed  # the fastest measured, not only modelled
    decoder = SpecDecoder.from_pretrained(base, heads=str(tmp_path / "heads"))
    assert decoder.drafter.dynamic.total_tokens == record["dynamic"]["total_tokens"]
    prompt = torch.tensor([[5, 6, 7, 8]])
    for tree in ("auto", "dynamic"):
        out = decoder.generate(prompt, max_new_tokens=12, tree=tree)
        assert torch.equal(out.sequences, greedy_reference(base, prompt, 12))


def test_calibrate_refuses_in_one_line_heads_whose_entry_says_they_cannot_be_calibrated(tmp_path, capsys) -> None:
    from specheads.cli import main
    from specheads.heads import DraftLM
    from specheads.registry import HEAD_TYPES

    assert not HEAD_TYPES["draft-lm"].calibratable  # its evaluation has no agreement by rank to grow trees from
    base = tiny_model("llama", seed=1, layers=4)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    DraftLM.from_base(base, num_layers=2).save_pretrained(tmp_path / "heads")
    (tmp_path / "data.txt").write_text("def f(x):\n    return x * 2\n" * 40)
    args = ["calibrate", "--base", str(tmp_path / "base"), "--heads", str(tmp_path / "heads")]
    args += ["--data", str(tmp_path / "data.txt"), "--max-length", "64", "--batches", "2"]
    assert main(args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "calibrate" in line or "Error" in line]
    assert len(errors) == 1 and errors[0].startswith("specheads calibrate: error: draft-lm heads cannot be"), errors
    assert not (tmp_path / "heads" / "tree.json").exists()


def test_dynamic_parameters_cover_the_tree_shape() -> None:
    from specheads.methods.eagle.trees import dynamic_parameters

    assert dynamic_parameters([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]) == {
        "top_k": 2,  # ranks 0-1; two nodes expanded at depth 1
        "depth": 3,
        "total_tokens": 6,
    }
    assert dynamic_parameters([[0], [0, 0], [0, 0, 0]]) == {"top_k": 1, "depth": 3, "total_tokens": 3}
    assert dynamic_parameters([]) == {"top_k": 1, "depth": 1, "total_tokens": 1}


def test_a_per_level_draft_cost_is_charged_per_tree_level() -> None:
    cheap = choose_tree(AGREEMENT, {1: 10.0, 64: 12.0}, max_nodes=20)
    costly = choose_tree(AGREEMENT, {1: 10.0, 64: 12.0}, max_nodes=20, depth_ms=7.0)
    assert len(costly.choices) < len(cheap.choices)
    depth = max(map(len, cheap.choices))
    assert cheap.step_ms + 7.0 * depth == pytest.approx(
        choose_tree(AGREEMENT, {1: 10.0 + 7.0 * depth, 64: 12.0 + 7.0 * depth}, max_nodes=20).step_ms
    )


def test_calibrate_reads_the_recipe_held_out_split_and_times_plain_decoding(tmp_path, capsys) -> None:
    """--config: the recipe's base, data, format, max_length and held-out split; plain decoding is a timed row and
    untrained heads (slower than plain here) get a warning instead of a silent 'auto' tree."""
    import yaml

    from specheads.cli import main

    base = tiny_model("llama", seed=1)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    MedusaHeads.from_base(base, num_heads=3).save_pretrained(tmp_path / "heads")
    lines = [f"def f{index}(x):\n    return x * {index}\n" for index in range(200)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    recipe = {
        "model": {"base": str(tmp_path / "base")},
        "heads": {"type": "medusa", "num_heads": 3},
        "data": {"paths": [str(tmp_path / "data.jsonl")], "format": "jsonl", "max_length": 32, "packing": False},
        "output": {"dir": str(tmp_path / "run")},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    args = ["calibrate", "--config", str(tmp_path / "recipe.yaml"), "--heads", str(tmp_path / "heads")]
    args += ["--batches", "2", "--max-nodes", "4", "--new-tokens", "4"]
    assert main(args) == 2  # a usage error: the recipe holds out no data
    assert "holds out no data" in capsys.readouterr().err
    recipe["data"]["heldout_fraction"] = 0.3
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    capsys.readouterr()
    assert main(args) == 0
    record = json.loads((tmp_path / "heads" / "tree.json").read_text())
    assert record["plain_tokens_per_s"] > 0
    fastest = max(row["tokens_per_s"] for row in record["measured"])
    assert record["best_speedup_over_plain"] == pytest.approx(fastest / record["plain_tokens_per_s"])
    printed = capsys.readouterr().out
    assert "measured plain decoding" in printed and "held-out batches" in printed
    assert ("no tree beats plain decoding" in printed) == (record["best_speedup_over_plain"] < 1.0)


def test_calibrate_a_block_drafter_times_ddtree_budgets_and_pays_its_draft_once_per_step(tmp_path, capsys) -> None:
    from specheads.cli import main
    from specheads.methods.dflash.heads import DFlashHead
    from specheads.methods.dflash.trees import BlockTree

    base = tiny_model("llama", seed=1, layers=4)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    DFlashHead.from_base(base, variant="dspark", block_size=4, markov_rank=8).save_pretrained(tmp_path / "heads")
    (tmp_path / "data.txt").write_text("def f(x):\n    return x * 2\n" * 40)
    args = ["calibrate", "--base", str(tmp_path / "base"), "--heads", str(tmp_path / "heads")]
    args += ["--data", str(tmp_path / "data.txt"), "--max-length", "64", "--batches", "2", "--new-tokens", "6"]
    assert main([*args, "--max-nodes", "8"]) == 0
    record = json.loads((tmp_path / "heads" / "tree.json").read_text())
    assert record["draft_ms_per_step"] > 0 and "draft_ms_per_level" not in record
    assert f"DDTree node budget for this machine (tree='ddtree'): {record['budget']}" in capsys.readouterr().out
    budgets = [row["nodes"] for row in record["measured"] if row["tree"] == {"total_tokens": row["nodes"]}]
    assert budgets == [2, 4, 8] and record["budget"] in budgets  # the fastest measured budget
    # the cost model charges the block once: a deeper tree of the same size costs the same
    sizes = {row["nodes"]: row["step_ms"] for row in record["candidates"]}
    verify = {int(q): ms for q, ms in record["verify_ms_by_query_tokens"].items()}
    assert abs(sizes[1] - verify[2] - record["draft_ms_per_step"]) < 1e-6
    decoder = SpecDecoder.from_pretrained(base, heads=str(tmp_path / "heads"))
    assert decoder.drafter.resolve("ddtree") == decoder.drafter.resolve("auto") == BlockTree(record["budget"])
    prompt = torch.tensor([[5, 6, 7, 8]])
    for tree in ("auto", "ddtree", "chain-2"):
        out = decoder.generate(prompt, max_new_tokens=12, tree=tree)
        assert torch.equal(out.sequences, greedy_reference(base, prompt, 12))


def test_tree_json_is_written_with_a_plain_files_permissions(tmp_path) -> None:
    import os
    import stat

    from specheads.calibrate import write_calibration

    mask = os.umask(0o022)
    try:
        path = write_calibration(tmp_path, {"choices": [[0]]})
    finally:
        os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert json.loads(path.read_text()) == {"choices": [[0]], "by_dtype": {"float32/cpu": {"choices": [[0]]}}}


def test_calibrations_are_kept_per_dtype_and_auto_reads_the_bases_own(tmp_path) -> None:
    """A bf16 calibration does not replace the float32 one; heads loaded onto a bf16 base read the bf16 tree, onto
    a float32 base the float32 tree; a file written before dtypes were recorded counts as float32."""
    from specheads.heads.calibration import calibration_key, write_calibration

    base = tiny_model("llama", seed=1)
    MedusaHeads.from_base(base, num_heads=3).save_pretrained(tmp_path)
    (tmp_path / "tree.json").write_text(json.dumps({"choices": [[0]]}))  # an old, dtype-less record
    write_calibration(tmp_path, {"choices": [[0], [1], [0, 0]], "dtype": "bfloat16/cpu"})
    record = json.loads((tmp_path / "tree.json").read_text())
    assert set(record["by_dtype"]) == {"float32/cpu", "bfloat16/cpu"}
    assert calibration_key(base) == "float32/cpu"
    assert load_heads(tmp_path, base).calibration.tree == [[0]]
    bf16 = tiny_model("llama", seed=1).to(torch.bfloat16)
    assert calibration_key(bf16) == "bfloat16/cpu"
    assert load_heads(tmp_path, bf16).calibration.tree == [[0], [1], [0, 0]]
    write_calibration(tmp_path, {"choices": [[0], [1]], "dtype": "float32/cpu"})  # recalibrating replaces its own
    record = json.loads((tmp_path / "tree.json").read_text())
    assert record["by_dtype"]["float32/cpu"]["choices"] == [[0], [1]]
    assert record["by_dtype"]["bfloat16/cpu"]["choices"] == [[0], [1], [0, 0]]
