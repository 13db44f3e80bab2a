"""Every method's training step reads the base's logits as its loss needs them and no more: the forward never builds
its whole ``[B, T, V]`` logits (only the last position's), the teacher is projected from the final hidden state a
chunk of positions at a time or at the positions the loss scores, and the losses and logged metrics are those of the
whole logits (a base whose lm_head cannot be projected alone, which is the reference here)."""

from __future__ import annotations

from typing import Any

import datasets
import pytest
import torch
from accelerate import Accelerator
from helpers import tiny_model
from training_helpers import ragged_batch

from specheads.registry import HEAD_TYPES
from specheads.training import features
from specheads.training.step import StepContext

# Methods whose default recipe trains against the data's tokens (Medusa-1's heads): their step reads none of the
# base's logits, with a projectable lm_head or without.
DATA_TARGETS = {"medusa"}


def _batch(seed: int, rows: int = 2, length: int = 20) -> dict[str, torch.Tensor]:
    return ragged_batch(seed, rows, length, padding=3)


def _step(name: str, base: torch.nn.Module, heads: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Any:
    method = HEAD_TYPES[name]
    context = StepContext(0, 0, 0, method.recipe_section()(), None, True, base, heads, Accelerator(cpu=True))
    torch.manual_seed(0)
    return method.train_step_fn()(context, batch)


@pytest.mark.parametrize("name", sorted(HEAD_TYPES))
def test_a_methods_logging_step_reads_no_whole_logits_and_loses_nothing_by_it(name: str, monkeypatch) -> None:
    method = HEAD_TYPES[name]
    base = tiny_model("llama", seed=1, layers=4, logit_scale=4.0).requires_grad_(False)
    batch = _batch(0)
    dataset = datasets.Dataset.from_dict({key: value.tolist() for key, value in batch.items()}).with_format("torch")
    torch.manual_seed(0)
    heads = method.build_heads(base, method.recipe_section()(), dataset)
    shapes: list[tuple[int, ...]] = []
    base.register_forward_hook(lambda module, args, output: shapes.append(tuple(output.logits.shape)))
    lean = _step(name, base, heads, batch)
    lean_shapes = list(shapes)
    shapes.clear()
    monkeypatch.setattr(features, "projectable", lambda model: False)  # the reference: the forward's whole logits
    whole = _step(name, base, heads, batch)
    rows, length = batch["input_ids"].shape
    assert lean_shapes == [(rows, 1, base.config.vocab_size)], f"{name}: {lean_shapes}"
    reference_length = 1 if name in DATA_TARGETS else length
    assert shapes == [(rows, reference_length, base.config.vocab_size)], f"{name}: the reference read {shapes}"
    torch.testing.assert_close(lean.loss, whole.loss, rtol=1e-5, atol=1e-6)
    assert lean.metrics.keys() == whole.metrics.keys()
    assert lean.metrics == pytest.approx(whole.metrics, rel=1e-5, abs=1e-6), name
    assert lean.weight == whole.weight


def test_a_projected_teacher_equals_the_teacher_of_the_whole_logits() -> None:
    """Probabilities and greedy columns over rows and a draft vocabulary, projected a chunk at a time, equal those
    read from the whole ``[N, V]`` logits."""
    from specheads.training import losses
    from specheads.training.losses import TeacherLogits

    generator = torch.Generator().manual_seed(3)
    hidden, weight, bias = (torch.randn(*shape, generator=generator) for shape in ((30, 16), (96, 16), (96,)))
    logits = torch.nn.functional.linear(hidden, weight, bias)
    rows, columns = torch.tensor([4, 0, 29, 7, 7, 12]), torch.tensor([5, 1, 40, 7, 93, 60, 2])
    for rows_, columns_ in ((None, None), (rows, None), (rows, columns), (None, columns)):
        whole = TeacherLogits(logits, rows_, columns_)
        projected = TeacherLogits(hidden, rows_, columns_, projection=(weight, bias))
        count = len(whole)
        assert len(projected) == count
        torch.testing.assert_close(projected.probabilities(0, count), whole.probabilities(0, count))
        torch.testing.assert_close(projected.probabilities(2, 5), whole.probabilities(2, 5))
        original = losses.CHUNK_ELEMENTS
        losses.CHUNK_ELEMENTS = 4 * 96  # four rows a chunk
        try:
            assert torch.equal(projected.greedy(), whole.greedy())
        finally:
            losses.CHUNK_ELEMENTS = original
        assert projected.greedy().shape == (count,)
