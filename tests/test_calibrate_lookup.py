"""Calibrating prompt lookup's share of the tree: the choice rule on hand numbers, the stored split read back by
``from_pretrained(..., prompt_lookup=True)``, the documented defaults without one, and ``calibrate --prompt-lookup``."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import greedy_reference, tiny_model, tiny_tokenizer

from specheads import SpecDecoder
from specheads.calibrate import LOOKUP_PROBE_TOKENS, choose_lookup_tokens, lookup_threshold
from specheads.heads import EagleHead, MedusaHeads, load_heads
from specheads.heads.calibration import calibration_key, write_calibration
from specheads.inference.lookup import DEFAULT_TOKENS_BY_MATCH, PromptLookup, WithLookup


def test_the_threshold_is_tau_times_the_marginal_node_cost_over_the_step() -> None:
    curve = {1: 10.0, 65: 74.0}  # 1 ms per verified node
    # 3 nodes, tau 2 in 20 ms: one more node pays when accepted at least 2 * 1 / 20 of the times.
    assert lookup_threshold(curve, nodes=3, tau=2.0, step_time_ms=20.0, extra_nodes=20) == pytest.approx(0.1)
    assert lookup_threshold(curve, nodes=3, tau=4.0, step_time_ms=20.0, extra_nodes=20) == pytest.approx(0.2)
    assert lookup_threshold({1: 10.0, 64: 10.0}, nodes=3, tau=2.0, step_time_ms=20.0, extra_nodes=20) == 0.0
    # The slope over the nodes the lookup may add: the curve is flat up to 9 tokens, then 2 ms a node.
    bent = {1: 10.0, 9: 10.0, 19: 30.0}
    assert lookup_threshold(bent, nodes=3, tau=1.0, step_time_ms=10.0, extra_nodes=4) == 0.0
    assert lookup_threshold(bent, nodes=8, tau=1.0, step_time_ms=10.0, extra_nodes=10) == pytest.approx(0.2)


def test_each_match_length_keeps_the_depths_whose_acceptance_pays() -> None:
    offered = {2: [20, 20, 20, 20], 3: [10, 10, 10, 10, 10], 4: [10, 10, 10]}
    taken = {2: [10, 3, 1, 0], 3: [9, 8, 2, 2, 1], 4: [9, 9, 9]}
    # n=2: 0.50, 0.15 pass, 0.05 fails; n=3: down to 0.10 >= 0.10 at depth 5; n=4: its 3 measured depths;
    # n=5..8 were never matched: n=4's choice; n=0, 1 are below min_ngram.
    tokens = choose_lookup_tokens(offered, taken, 0.1, min_ngram=2, max_ngram=8)
    assert tokens == (0, 0, 2, 5, 3, 3, 3, 3, 3)
    assert choose_lookup_tokens(offered, taken, 0.16, min_ngram=2, max_ngram=8)[:5] == (0, 0, 1, 4, 3)
    assert choose_lookup_tokens(offered, taken, 0.95, min_ngram=2, max_ngram=8) == (0,) * 9


def test_a_failing_depth_ends_the_branch_and_thin_or_never_accepted_depths_are_not_kept() -> None:
    # Depth 3 (0.25 on 4 offers) passes 0.2 but depth 2 (0.1) does not: the branch ends at 1.
    assert choose_lookup_tokens({2: [10, 10, 4]}, {2: [5, 1, 1]}, 0.2, min_ngram=2, max_ngram=2) == (0, 0, 1)
    # A free verifier (threshold 0) still keeps no token that was never accepted.
    assert choose_lookup_tokens({2: [10, 10, 10]}, {2: [5, 2, 0]}, 0.0, min_ngram=2, max_ngram=2) == (0, 0, 2)
    # Depth 2 was offered 3 times, fewer than min_offers: not measured, not kept.
    assert choose_lookup_tokens({2: [10, 3]}, {2: [9, 3]}, 0.1, min_ngram=2, max_ngram=2, min_offers=4) == (0, 0, 1)


def test_higher_thresholds_never_lengthen_a_branch() -> None:
    generator = torch.Generator().manual_seed(0)
    offered = {n: [40] * 8 for n in range(2, 7)}
    taken = {n: sorted(torch.randint(0, 41, (8,), generator=generator).tolist(), reverse=True) for n in offered}
    previous = None
    for threshold in (0.0, 0.05, 0.2, 0.4, 0.6, 0.8, 1.0):
        tokens = choose_lookup_tokens(offered, taken, threshold, min_ngram=2, max_ngram=6)
        if previous is not None:
            assert all(now <= before for now, before in zip(tokens, previous, strict=True))
        previous = tokens
    assert previous != choose_lookup_tokens(offered, taken, 0.0, min_ngram=2, max_ngram=6)


def test_without_measurements_the_documented_defaults_hold() -> None:
    tokens = choose_lookup_tokens({}, {}, 0.1, min_ngram=2, max_ngram=8)
    assert all(PromptLookup(tokens_by_match=tokens).tokens_for(n) == PromptLookup().tokens_for(n) for n in range(2, 12))
    assert PromptLookup().tokens_by_match == DEFAULT_TOKENS_BY_MATCH


def _heads(kind: str, base: torch.nn.Module) -> torch.nn.Module:
    return MedusaHeads.from_base(base, num_heads=2) if kind == "medusa" else EagleHead.from_base(base, version=3)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_from_pretrained_composes_the_stored_split_and_the_defaults_without_one(kind: str, tmp_path) -> None:
    base = tiny_model("llama", seed=1, layers=4)
    _heads(kind, base).save_pretrained(tmp_path)
    write_calibration(tmp_path, {"choices": [[0]], "dtype": calibration_key(base)})  # calibrated without a lookup
    assert SpecDecoder.from_pretrained(base, heads=str(tmp_path), prompt_lookup=True).drafter.settings == PromptLookup()
    stored = PromptLookup(candidates=1, tokens_by_match=(0, 0, 1, 3))
    write_calibration(tmp_path, {"choices": [[0]], "dtype": calibration_key(base), "lookup": stored.record()})
    decoder = SpecDecoder.from_pretrained(base, heads=str(tmp_path), prompt_lookup=True)
    assert isinstance(decoder.drafter, WithLookup) and decoder.drafter.settings == stored
    chosen = PromptLookup(max_ngram=4)  # settings given explicitly win over the calibration
    assert SpecDecoder.from_pretrained(base, heads=str(tmp_path), prompt_lookup=chosen).drafter.settings == chosen
    assert not isinstance(SpecDecoder.from_pretrained(base, heads=str(tmp_path)).drafter, WithLookup)
    prompt = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    out = decoder.generate(prompt, max_new_tokens=10)
    assert torch.equal(out.sequences, greedy_reference(base, prompt, 10))


def test_calibrate_prompt_lookup_stores_the_split_that_generate_reads(tmp_path, capsys) -> None:
    from specheads.cli import main

    base = tiny_model("llama", seed=1)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    MedusaHeads.from_base(base, num_heads=2).save_pretrained(tmp_path / "heads")
    (tmp_path / "data.txt").write_text("def f(x):\n    return x * 2\n" * 40)
    args = ["calibrate", "--base", str(tmp_path / "base"), "--heads", str(tmp_path / "heads")]
    args += ["--data", str(tmp_path / "data.txt"), "--max-length", "64", "--batches", "1", "--max-nodes", "2"]
    assert main([*args, "--new-tokens", "24", "--prompt-lookup"]) == 0
    assert "prompt lookup tokens by match length" in capsys.readouterr().out
    record = json.loads((tmp_path / "heads" / "tree.json").read_text())
    lookup = record["lookup"]
    settings = PromptLookup.from_record(lookup)
    assert len(settings.tokens_by_match) == settings.max_ngram + 1
    assert settings.tokens_by_match[: settings.min_ngram] == (0,) * settings.min_ngram
    assert max(settings.tokens_by_match) <= LOOKUP_PROBE_TOKENS
    assert lookup["offered_by_match"], "the repeated held-out text gives the lookup matches to measure"
    # The stored table is the rule's choice on the stored measurements.
    offered = {int(n): counts for n, counts in lookup["offered_by_match"].items()}
    taken = {
        n: [round(rate * count) for rate, count in zip(lookup["acceptance_by_match"][str(n)], counts, strict=True)]
        for n, counts in offered.items()
    }
    rule = choose_lookup_tokens(offered, taken, lookup["threshold"], settings.min_ngram, settings.max_ngram)
    assert settings.tokens_by_match == rule
    assert load_heads(tmp_path / "heads", base).calibration.lookup == lookup
    decoder = SpecDecoder.from_pretrained(str(tmp_path / "base"), heads=str(tmp_path / "heads"), prompt_lookup=True)
    assert decoder.drafter.settings == settings
    generate = ["generate", "--base", str(tmp_path / "base"), "--heads", str(tmp_path / "heads")]
    assert main([*generate, "--max-new-tokens", "12", "--json", "--prompt-lookup", "x = 1"]) == 0
    with_lookup = json.loads(capsys.readouterr().out)["new_tokens"]
    assert main([*generate, "--max-new-tokens", "12", "--json", "x = 1"]) == 0
    assert with_lookup == json.loads(capsys.readouterr().out)["new_tokens"]
