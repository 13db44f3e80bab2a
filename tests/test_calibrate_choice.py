"""What `specheads calibrate` chooses, checked against answers worked out by hand: the cost model's tree for a fixed
agreement table and verify-cost curve (including a bigger tree that loses to an expensive verify, and the tie rule),
and the record's final pick, the fastest measured static and dynamic trees (``tests/test_calibrate.py`` runs the
command end to end)."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from helpers import tiny_model

from specheads.calibrate import calibrate, choose_tree
from specheads.cli import build_parser
from specheads.heads import EagleHead
from specheads.heads.calibration import Calibration, calibrate_arguments
from specheads.methods.eagle.trees import TREES, DynamicTree

# Rank-r agreement at depths 1 and 2. Growth order (path: probability): (0,) .5, (1,) .3, (0, 0) .2, (1, 0) .12,
# (0, 1) .1, (1, 1) .06, so trees of 0-6 nodes expect tau 1, 1.5, 1.8, 2.0, 2.12, 2.22, 2.28.
AGREEMENT = [[0.5, 0.3], [0.4, 0.2]]
# Verify ms by query tokens (root included): cheap up to 4 tokens, steep after.
STEEP = {1: 10.0, 2: 11.0, 4: 13.0, 8: 30.0}


def test_the_cost_model_picks_the_size_with_the_most_expected_tokens_per_second() -> None:
    # nodes: step ms (q = nodes + 1, interpolated) -> tokens/s = 1000 tau / ms
    # 0: 10 -> 100; 1: 11 -> 136.4; 2: 12 -> 150; 3: 13 -> 153.8; 4: 17.25 -> 122.9; 5: 21.5 -> 103.3; 6: 25.75 -> 88.5
    best = choose_tree(AGREEMENT, STEEP, max_nodes=6)
    assert best.choices == [[0], [1], [0, 0]]  # the 4- to 6-node trees add tau but cost more than they add
    assert best.expected_tau == pytest.approx(2.0)
    assert best.step_ms == pytest.approx(13.0)
    assert best.expected_tokens_per_s == pytest.approx(2000 / 13)
    rates = [row["expected_tokens_per_s"] for row in best.candidates]
    assert rates == pytest.approx([100, 1500 / 11, 150, 2000 / 13, 2120 / 17.25, 2220 / 21.5, 2280 / 25.75])
    free = choose_tree(AGREEMENT, {1: 10.0, 8: 10.0}, max_nodes=6)  # a verify that costs the same at any size
    assert free.choices == [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]
    assert free.expected_tau == pytest.approx(2.28)


def test_a_draft_level_cost_makes_the_wide_shallow_tree_beat_the_deep_one() -> None:
    # 5 ms a level on top of STEEP: 0 nodes: 10 -> 100; 1: 16 -> 93.75; 2 (depth 1): 17 -> 105.9;
    # 3 (depth 2): 23 -> 87.0; 4: 27.25 -> 77.8; ...
    best = choose_tree(AGREEMENT, STEEP, max_nodes=6, depth_ms=5.0)
    assert best.choices == [[0], [1]]
    assert best.expected_tau == pytest.approx(1.8)
    assert best.step_ms == pytest.approx(17.0)


def test_of_tree_sizes_that_tie_the_smallest_wins() -> None:
    # tau 1, 1.5, 1.75 at 11, 15, 17.5 ms: 90.9, 100 and 100 tokens/s (exactly, in binary floating point)
    best = choose_tree([[0.5, 0.25]], {1: 11.0, 2: 15.0, 3: 17.5}, max_nodes=2)
    assert [row["expected_tokens_per_s"] for row in best.candidates][1:] == [100.0, 100.0]
    assert best.choices == [[0]]


def test_the_record_keeps_the_fastest_measured_trees_not_the_modelled_or_the_largest(monkeypatch) -> None:
    """calibrate() with its measurements replaced by fixed numbers: the agreement above, STEEP, a 5 ms draft level
    and measured decoding rates chosen so that the fastest static tree is neither the cost model's pick nor the
    largest, and the fastest dynamic tree is neither the largest nor the one grown from the fastest static tree."""
    # Timed static trees: growth prefixes of 1, 2, 3, 4 and 6 nodes; the dynamic trees that grow their shapes:
    # (top_k, depth, total_tokens) = (1, 1, 1), (2, 1, 2), (2, 2, 3), (2, 2, 4), (2, 2, 6).
    static_rates = {1: 50.0, 2: 70.0, 3: 65.0, 4: 90.0, 6: 60.0}
    dynamic_rates = {1: 40.0, 2: 55.0, 3: 95.0, 4: 80.0, 6: 85.0}
    plain_rate = 60.0
    timed = []

    def measure_decoding(decoder, prompts, trees, **kwargs):
        timed.extend(trees)
        rates = [static_rates[len(t)] if isinstance(t, list) else dynamic_rates[t.total_tokens] for t in trees]
        return [{"tokens_per_s": rate, "tau": 1.0} for rate in [*rates, plain_rate]]

    monkeypatch.setattr(
        "specheads.methods.eagle.train.eagle_agreement", lambda *args, **kwargs: {"agreement_by_rank": AGREEMENT}
    )
    monkeypatch.setattr("specheads.methods.eagle.drafter.measure_draft_cost", lambda heads: 5.0)
    monkeypatch.setattr("specheads.calibrate.measure_verify_cost", lambda base, sizes: STEEP)
    monkeypatch.setattr("specheads.calibrate.measure_decoding", measure_decoding)
    base = tiny_model("llama", seed=1, layers=4)
    ids = torch.randint(2, 96, (4, 12), generator=torch.Generator().manual_seed(0)).tolist()
    rows = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 12] * 4, "loss_mask": [[1] * 12] * 4})
    record = calibrate(base, EagleHead.from_base(base, version=3), rows, max_nodes=6, new_tokens=24).record

    assert [len(t) for t in timed if isinstance(t, list)] == [1, 2, 3, 4, 6]
    assert record["model_choice"] == [[0], [1]]  # the cost model, as in the test above
    assert record["expected_tau"] == pytest.approx(1.8) and record["step_ms"] == pytest.approx(17.0)
    assert record["choices"] == [[0], [1], [0, 0], [1, 0]]  # measured 90 tokens/s
    assert record["dynamic"] == {"top_k": 2, "depth": 2, "total_tokens": 3}  # measured 95 tokens/s
    assert record["plain_tokens_per_s"] == plain_rate
    assert record["best_speedup_over_plain"] == pytest.approx(95 / 60)
    calibration = Calibration.from_record(record)  # what tree="auto" / "dynamic" decode with
    assert calibration.tree == [[0], [1], [0, 0], [1, 0]]
    assert TREES.calibrated(calibration) == DynamicTree(top_k=2, depth=2, total_tokens=3)
    # the record says how it was measured, as specheads calibrate's own arguments (which parse back to the same)
    assert record["options"] == {
        "threads": torch.get_num_threads(),
        "batches": 8,
        "max_nodes": 6,
        "prompt_tokens": 128,
        "new_tokens": 24,
        "prompt_lookup": False,
    }
    arguments = calibrate_arguments(record)
    parsed = build_parser().parse_args(["calibrate", "--heads", "h", *arguments.split()])
    assert (parsed.threads, parsed.batches, parsed.max_nodes, parsed.new_tokens) == (torch.get_num_threads(), 8, 6, 24)
    assert parsed.prompt_tokens == 128 and not parsed.prompt_lookup
    assert calibrate_arguments({**record, "options": {**record["options"], "prompt_lookup": True}}).endswith(
        " --prompt-lookup"
    )
    assert calibrate_arguments({key: value for key, value in record.items() if key != "options"}) is None
