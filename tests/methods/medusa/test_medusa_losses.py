"""Medusa's losses, checked by hand: head k at position t predicts token t + 2 + k (an off-by-one is punished, masked
and out-of-sequence targets do not count), the loss through a head's projection equals the loss of its logits,
gradients included, and Medusa-2's head weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from training_helpers import LOSS_TOKENS, LOSS_VOCAB, one_hot_logits

from specheads.methods.medusa.losses import head_targets, medusa2_head_weights, medusa_head_loss, medusa_loss

VOCAB, TOKENS = LOSS_VOCAB, LOSS_TOKENS


def _grads(loss: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, tensors))


def test_head_targets_by_hand() -> None:
    mask = torch.ones_like(TOKENS)
    targets, valid = head_targets(TOKENS, mask, head=0)
    assert targets.tolist() == [[12, 13, 14, 15]]  # position 0 predicts token 2, ...
    targets, valid = head_targets(TOKENS, mask, head=2)
    assert targets.tolist() == [[14, 15]]  # position 0 predicts token 4
    assert valid.all()


def test_a_head_that_predicts_t_plus_2_plus_k_has_zero_loss() -> None:
    head0 = one_hot_logits([12, 13, 14, 15, None, None])
    head1 = one_hot_logits([13, 14, 15, None, None, None])
    result = medusa_loss(torch.stack([head0, head1]), TOKENS, torch.ones_like(TOKENS))
    assert torch.allclose(result.loss, torch.zeros(2), atol=1e-6)
    assert result.top1.tolist() == [1.0, 1.0]
    assert result.count.tolist() == [4.0, 3.0]


def test_off_by_one_alignment_is_punished() -> None:
    head0 = one_hot_logits([11, 12, 13, 14, 15, None])  # predicts t + 1: what the base does, not head 0
    result = medusa_loss(head0[None], TOKENS, torch.ones_like(TOKENS))
    assert result.loss[0] > 10
    assert result.top1[0] == 0.0


def test_masked_targets_do_not_count() -> None:
    mask = torch.ones_like(TOKENS)
    mask[0, 3] = 0  # token 13 is not a target (e.g. a user token)
    wrong_only_there = one_hot_logits([12, 0, 14, 15, None, None])  # position 1 predicts token 3 wrongly
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


def test_medusa2_weights() -> None:
    weights = medusa2_head_weights(3, weight=0.2, decay=0.8, schedule=0.5)
    assert torch.allclose(weights, torch.tensor([0.1, 0.08, 0.064]))


def test_medusa_head_loss_through_the_projection_equals_the_loss_of_the_logits() -> None:
    generator = torch.Generator().manual_seed(4)
    states = torch.randn(2, 6, 5, generator=generator).requires_grad_()
    weight = torch.randn(VOCAB, 5, generator=generator).requires_grad_()
    tokens = torch.randint(0, VOCAB, (2, 6), generator=generator)
    mask = torch.ones_like(tokens)
    mask[1, 4] = 0
    for head in range(3):  # every head reads the same states here; head k is scored against token t + 2 + k
        projected = medusa_head_loss(states, tokens, mask, head, weight)
        reference = medusa_loss(F.linear(states, weight).expand(3, -1, -1, -1), tokens, mask)
        expected = torch.stack([reference.top1[head], reference.top5[head], reference.count[head]])
        torch.testing.assert_close(projected[0], reference.loss[head])
        torch.testing.assert_close(torch.stack(projected[1:]), expected)
        got = _grads(projected[0], states, weight)
        for got_grad, expected_grad in zip(got, _grads(reference.loss[head], states, weight), strict=True):
            torch.testing.assert_close(got_grad, expected_grad)
