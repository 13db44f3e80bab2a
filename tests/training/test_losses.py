"""Loss alignment, checked by hand: head k at position t predicts token t + 2 + k."""

from __future__ import annotations

import torch

from specheads.training.losses import (
    distillation_loss,
    head_targets,
    lm_loss,
    medusa2_head_weights,
    medusa_loss,
)

VOCAB = 20
TOKENS = torch.tensor([[10, 11, 12, 13, 14, 15]])  # [1, 6]


def _one_hot_logits(targets_by_position: list[int | None], length: int = 6) -> torch.Tensor:
    logits = torch.full((1, length, VOCAB), -10.0)
    for position, token in enumerate(targets_by_position):
        if token is not None:
            logits[0, position, token] = 10.0
    return logits


def test_head_targets_by_hand() -> None:
    mask = torch.ones_like(TOKENS)
    targets, valid = head_targets(TOKENS, mask, head=0)
    assert targets.tolist() == [[12, 13, 14, 15]]  # position 0 predicts token 2, ...
    targets, valid = head_targets(TOKENS, mask, head=2)
    assert targets.tolist() == [[14, 15]]  # position 0 predicts token 4
    assert valid.all()


def test_a_head_that_predicts_t_plus_2_plus_k_has_zero_loss() -> None:
    head0 = _one_hot_logits([12, 13, 14, 15, None, None])
    head1 = _one_hot_logits([13, 14, 15, None, None, None])
    result = medusa_loss(torch.stack([head0, head1]), TOKENS, torch.ones_like(TOKENS))
    assert torch.allclose(result.loss, torch.zeros(2), atol=1e-6)
    assert result.top1.tolist() == [1.0, 1.0]
    assert result.count.tolist() == [4.0, 3.0]


def test_off_by_one_alignment_is_punished() -> None:
    head0 = _one_hot_logits([11, 12, 13, 14, 15, None])  # predicts t + 1: what the base does, not head 0
    result = medusa_loss(head0[None], TOKENS, torch.ones_like(TOKENS))
    assert result.loss[0] > 10
    assert result.top1[0] == 0.0


def test_masked_targets_do_not_count() -> None:
    mask = torch.ones_like(TOKENS)
    mask[0, 3] = 0  # token 13 is not a target (e.g. a user token)
    wrong_only_there = _one_hot_logits([12, 0, 14, 15, None, None])  # position 1 predicts token 3 wrongly
    result = medusa_loss(wrong_only_there[None], TOKENS, mask)
    assert result.count.tolist() == [3.0]
    assert result.loss[0] < 1e-6


def test_heads_beyond_the_sequence_contribute_nothing() -> None:
    short = TOKENS[:, :3]
    logits = torch.zeros(3, 1, 3, VOCAB, requires_grad=True)
    result = medusa_loss(logits, short, torch.ones_like(short))
    assert result.count.tolist() == [1.0, 0.0, 0.0]
    result.loss.sum().backward()
    assert logits.grad is not None


def test_lm_loss_is_next_token() -> None:
    logits = _one_hot_logits([11, 12, 13, 14, 15, None])
    assert lm_loss(logits, TOKENS, torch.ones_like(TOKENS)) < 1e-6


def test_distillation_is_zero_for_identical_logits_and_positive_otherwise() -> None:
    logits = torch.randn(1, 6, VOCAB)
    mask = torch.ones_like(TOKENS)
    assert distillation_loss(logits, logits, mask).abs() < 1e-6
    assert distillation_loss(logits, torch.randn(1, 6, VOCAB), mask) > 0.1


def test_medusa2_weights() -> None:
    weights = medusa2_head_weights(3, weight=0.2, decay=0.8, schedule=0.5)
    assert torch.allclose(weights, torch.tensor([0.1, 0.08, 0.064]))
