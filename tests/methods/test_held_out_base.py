"""Every method's held-out evaluation reads the base as training does: one view a batch (one forward with its hidden
states), whose greedy tokens come a chunk of positions at a time, never the forward's whole ``[B, T, V]`` logits."""

from __future__ import annotations

from typing import Any

import datasets
import pytest
import torch
from helpers import tiny_model
from training_helpers import ragged_batch

from specheads.registry import HEAD_TYPES


def _batch(seed: int, rows: int = 2, length: int = 20) -> dict[str, torch.Tensor]:
    return ragged_batch(seed, rows, length, padding=3)


@pytest.mark.parametrize("name", sorted(HEAD_TYPES))
def test_a_methods_evaluation_runs_the_base_once_a_batch_without_its_whole_logits(name: str) -> None:
    method = HEAD_TYPES[name]
    base = tiny_model("llama", seed=1, layers=4)
    rows = [_batch(seed) for seed in range(2)]
    dataset = datasets.Dataset.from_dict({key: torch.cat([r[key] for r in rows]).tolist() for key in rows[0]})
    torch.manual_seed(0)
    heads = method.build_heads(base, method.recipe_section()(), dataset.with_format("torch")).eval()
    calls: list[dict[str, Any]] = []
    logits_shapes: list[tuple[int, ...]] = []
    base.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs), with_kwargs=True)
    base.register_forward_hook(lambda module, args, output: logits_shapes.append(tuple(output.logits.shape)))
    batches = [_batch(seed) for seed in (3, 4, 5)]
    result = method.evaluate_fn()(base, heads, iter(batches), max_batches=2)
    assert result["agreement_with_base_greedy"]
    assert len(calls) == 2, f"{name}: {len(calls)} base forwards for 2 batches"
    assert all(call.get("output_hidden_states") for call in calls)
    assert logits_shapes == [(2, 1, base.config.vocab_size)] * 2, logits_shapes  # the last position's logits only
