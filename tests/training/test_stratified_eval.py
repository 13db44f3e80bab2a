"""scripts/stratified_eval.py on a tiny base: its per-depth agreement is the trainer's held-out evaluation's, split
into groups that add up, and its paired interval between a head and itself is zero."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import load_script, tiny_model
from training_helpers import make_workspace

from specheads import EagleHead
from specheads.methods.eagle.train import eagle_agreement


def _head(base: torch.nn.Module, seed: int) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead.from_base(base, version=3, draft_vocab_size=48, token_counts=torch.rand(96))
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return head.eval()


def _greedy_batches(base: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    """Two batches of the base's own greedy answers to 4-token prompts (the draft's path runs deep), one token of
    some rows changed (the path breaks there)."""
    prompts = torch.randint(2, 96, (8, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ids = base.generate(prompts, do_sample=False, max_new_tokens=16, pad_token_id=0)
    ids[::3, 10] = (ids[::3, 10] + 1) % 96
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :4] = 0
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}
    return [{key: value[:4] for key, value in batch.items()}, {key: value[4:] for key, value in batch.items()}]


def test_strata_are_the_heldout_evaluation_split_into_groups_that_add_up() -> None:
    script = load_script("stratified_eval")
    base = tiny_model("llama", seed=1, layers=4)
    heads = [_head(base, 0), _head(base, 1)]
    batches = _greedy_batches(base)
    results = script.stratify(base, heads, batches, depth=3)
    for head, result in zip(heads, results, strict=True):
        reference = eagle_agreement(base, head, batches, depth=3)
        depths = result["depths"]
        assert [d["all"]["positions"] for d in depths] == reference["positions"]
        assert [d["all"]["agreement"] for d in depths] == pytest.approx(reference["agreement_with_base_greedy"])
        for groups in depths:  # each split covers every position once
            total = groups["all"]["positions"]
            for pair in (("copy", "novel"), ("in_vocab", "off_vocab")):
                assert sum(groups.get(name, {"positions": 0})["positions"] for name in pair) == total
            assert sum(g["positions"] for name, g in groups.items() if name.startswith("p1")) == total
        assert [sum(row[d][1] for row in result["row_counts"]) for d in range(3)] == reference["positions"]
        assert len(result["row_counts"]) == 8 and len(result["feature_norms"]) == 3
    assert reference["positions"][0] > reference["positions"][2] > 0  # deeper depths: fewer positions, still some
    assert results[0]["depths"] != results[1]["depths"]


def test_the_script_prints_tables_and_pairs_heads(tmp_path, capsys) -> None:
    workspace = make_workspace(tmp_path, layers=4)
    base = tiny_model("llama", seed=1, layers=4)
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    _head(base, 0).save_pretrained(first)
    _head(base, 1).save_pretrained(second)
    overrides = [
        f"model.base={workspace / 'base'}", f"data.paths=[{workspace / 'data'}]", "data.format=text",
        f"data.eval_paths=[{workspace / 'data'}]", "data.max_length=24", "heads.type=eagle",
    ]  # fmt: skip
    out = tmp_path / "strata.json"
    args = ["--heads", first, "--heads", second, "--heads", first, "--depth", "2", "--rounds", "200", "--out", str(out)]
    results = load_script("stratified_eval").main([*args, *overrides])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert [r["heads"] for r in results] == [first, second, first]
    assert results[2]["paired_vs_first"][0] == [0.0, 0.0, 0.0]  # a head against itself, at depth 1
    difference, low, high = results[1]["paired_vs_first"][0]
    agreements = [r["depths"][0]["all"]["agreement"] for r in results[:2]]
    assert difference == pytest.approx(agreements[1] - agreements[0]) and low <= difference <= high
    printed = capsys.readouterr().out
    assert printed.count("| group | depth 1 (share) | depth 2 (share) |") == 3
    assert "minus" in printed and "base top-1 probability > 0.5" in printed
