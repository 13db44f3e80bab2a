"""The shared losses, checked by hand: next-token and distillation losses, and the chunked projection losses equal
the unchunked ones, gradients included. Medusa's head losses are tested with Medusa (tests/methods/medusa/)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from training_helpers import LOSS_TOKENS, LOSS_VOCAB, one_hot_logits

from specheads.training.losses import TeacherLogits, distillation_loss, linear_cross_entropy, lm_loss

VOCAB, TOKENS = LOSS_VOCAB, LOSS_TOKENS


def test_lm_loss_is_next_token() -> None:
    logits = one_hot_logits([11, 12, 13, 14, 15, None])
    assert lm_loss(logits, TOKENS, torch.ones_like(TOKENS)) < 1e-6


def test_distillation_is_zero_for_identical_logits_and_positive_otherwise() -> None:
    logits = torch.randn(1, 6, VOCAB)
    mask = torch.ones_like(TOKENS)
    assert distillation_loss(logits, logits, mask).abs() < 1e-6
    assert distillation_loss(logits, torch.randn(1, 6, VOCAB), mask) > 0.1


# ------------------------------------------------------------------------------------------- chunked projections
def _projection_case(seed: int = 0, rows: int = 13, width: int = 7, vocab: int = 11):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(rows, width, generator=generator, dtype=torch.float64).requires_grad_()
    weight = torch.randn(vocab, width, generator=generator, dtype=torch.float64).requires_grad_()
    bias = torch.randn(vocab, generator=generator, dtype=torch.float64).requires_grad_()
    return inputs, weight, bias, generator


def _grads(loss: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, tensors))


@pytest.mark.parametrize("chunk_rows", [1, 4, 100])
def test_linear_cross_entropy_equals_the_unchunked_loss_and_gradients(chunk_rows: int) -> None:
    inputs, weight, bias, generator = _projection_case()
    rows = torch.tensor([0, 3, 4, 7, 12, 9])  # any subset, any order
    ids = torch.randint(0, 11, (6,), generator=generator)
    scored = linear_cross_entropy(inputs, weight, ids, rows=rows, bias=bias, top_k=3, chunk_rows=chunk_rows)
    logits = F.linear(inputs[rows], weight, bias)
    reference = F.cross_entropy(logits.float(), ids)
    torch.testing.assert_close(scored.loss, reference)
    for got, expected in zip(
        _grads(scored.loss, inputs, weight, bias), _grads(reference, inputs, weight, bias), strict=True
    ):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(scored.row_losses, F.cross_entropy(logits.float(), ids, reduction="none").detach())
    assert torch.equal(scored.top, logits.topk(3, dim=-1).indices)


@pytest.mark.parametrize("columns", [None, torch.tensor([1, 2, 5, 8, 10])])
def test_soft_targets_are_the_teachers_rows_renormalised_onto_the_columns(columns) -> None:
    inputs, weight, bias, generator = _projection_case(1)
    if columns is not None:
        weight = weight[columns].detach().requires_grad_()  # the student predicts the columns only
        bias = bias[columns].detach().requires_grad_()
    teacher = torch.randn(20, 11, generator=generator, dtype=torch.float64)
    teacher_rows = torch.randint(0, 20, (13,), generator=generator)
    targets = TeacherLogits(teacher, teacher_rows, columns)
    scored = linear_cross_entropy(inputs, weight, targets, bias=bias, chunk_rows=5)
    wanted = teacher[teacher_rows] if columns is None else teacher[teacher_rows][:, columns]
    probabilities = wanted.float().softmax(dim=-1)
    log_q = F.linear(inputs, weight, bias).float().log_softmax(dim=-1)
    reference = -(probabilities * log_q).sum(dim=-1).mean()
    torch.testing.assert_close(scored.loss, reference)
    for got, expected in zip(
        _grads(scored.loss, inputs, weight, bias), _grads(reference, inputs, weight, bias), strict=True
    ):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    if columns is not None:  # softmax over the columns == the full softmax restricted and renormalised
        full = teacher[teacher_rows].float().softmax(dim=-1)[:, columns]
        torch.testing.assert_close(probabilities, full / full.sum(dim=-1, keepdim=True))


def test_the_total_variation_term_adds_one_minus_the_acceptance_rate_with_its_gradient() -> None:
    inputs, weight, bias, generator = _projection_case(4)
    teacher = torch.randn(13, 11, generator=generator, dtype=torch.float64)
    weights = torch.rand(13, generator=generator, dtype=torch.float64)
    scored = linear_cross_entropy(
        inputs, weight, TeacherLogits(teacher), bias=bias, row_weights=weights, chunk_rows=4, tv_weight=0.7
    )
    p = teacher.float().softmax(dim=-1)
    q = F.linear(inputs, weight, bias).float().softmax(dim=-1)
    acceptance = torch.minimum(p, q).sum(dim=-1)  # what rejection sampling accepts of a token drafted from q
    per_row = -(p * q.log()).sum(dim=-1) + 0.7 * (1 - acceptance)
    reference = (weights.float() * per_row).sum()
    torch.testing.assert_close(scored.row_losses, per_row.detach())
    torch.testing.assert_close(scored.loss, reference)
    for got, expected in zip(
        _grads(scored.loss, inputs, weight, bias), _grads(reference, inputs, weight, bias), strict=True
    ):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="tv_weight needs soft targets"):
        linear_cross_entropy(inputs, weight, torch.zeros(13, dtype=torch.long), tv_weight=0.5)


def test_logits_without_a_projection_row_weights_and_kl() -> None:
    logits = torch.randn(2, 5, VOCAB, generator=torch.Generator().manual_seed(2)).requires_grad_()
    teacher = torch.randn(2, 5, VOCAB, generator=torch.Generator().manual_seed(3))
    flat, rows = logits.reshape(-1, VOCAB), torch.tensor([1, 2, 6, 9])
    weights = torch.tensor([0.5, 0.25, 0.125, 2.0])
    scored = linear_cross_entropy(
        flat,
        None,
        TeacherLogits(teacher.reshape(-1, VOCAB), rows),
        rows=rows,
        row_weights=weights,
        kl=True,
        chunk_rows=3,
    )
    per_row = F.kl_div(
        flat[rows].log_softmax(dim=-1),
        teacher.reshape(-1, VOCAB)[rows].log_softmax(dim=-1),
        log_target=True,
        reduction="none",
    ).sum(dim=-1)
    reference = (weights * per_row).sum()
    torch.testing.assert_close(scored.loss, reference)
    torch.testing.assert_close(scored.row_losses, per_row.detach())
    torch.testing.assert_close(_grads(scored.loss, logits)[0], _grads(reference, logits)[0])


def test_no_rows_give_a_zero_loss_connected_to_the_graph_and_no_grad_gives_no_gradients() -> None:
    inputs, weight, bias, _ = _projection_case()
    empty = linear_cross_entropy(
        inputs, weight, torch.zeros(0, dtype=torch.long), rows=torch.zeros(0, dtype=torch.long)
    )
    assert empty.loss == 0 and empty.row_losses.numel() == 0
    assert all(grad is not None for grad in _grads(empty.loss, inputs, weight))
    with torch.no_grad():
        scored = linear_cross_entropy(inputs, weight, torch.zeros(13, dtype=torch.long), bias=bias)
    assert not scored.loss.requires_grad and scored.loss > 0
