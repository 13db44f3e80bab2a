"""Medusa's losses: each head's cross-entropy against its token ahead, and Medusa-2's head weights.

Medusa (Cai et al. 2024): the base's lm_head at position t predicts token t + 1; Medusa head k (0-based) at position
t predicts token t + 2 + k. A target counts only when its own ``loss_mask`` is 1 (assistant tokens in chats, real
tokens rather than padding). Each head's vocabulary projection is scored a chunk of positions at a time
(:func:`~specheads.training.losses.linear_cross_entropy`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specheads.methods.api import flat_rows, linear_cross_entropy


@dataclass
class HeadLosses:
    """Per-head results of :func:`medusa_loss`; every tensor is ``[K]``."""

    loss: torch.Tensor  # mean cross-entropy over counted targets
    top1: torch.Tensor  # fraction of counted targets that are the head's argmax
    top5: torch.Tensor  # fraction of counted targets among the head's top 5
    count: torch.Tensor  # counted targets


def head_targets(input_ids: torch.Tensor, loss_mask: torch.Tensor, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets of Medusa head ``head`` at positions ``0 .. T - head - 3``.

    Args:
        input_ids: ``[B, T]`` tokens.
        loss_mask: ``[B, T]`` 1 where a token may be a target.
        head: 0-based head index k.

    Returns:
        ``targets [B, T - k - 2]`` (token t + 2 + k for position t) and ``mask [B, T - k - 2]`` (bool).
    """
    shift = head + 2
    return input_ids[:, shift:], loss_mask[:, shift:].bool()


def medusa_loss(
    head_logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, accuracy: bool = True
) -> HeadLosses:
    """Cross-entropy of each Medusa head against the tokens 2 + k positions ahead.

    Args:
        head_logits: ``[K, B, T, V]`` logits of every head at every position.
        input_ids: ``[B, T]``.
        loss_mask: ``[B, T]``.
        accuracy: also compute top-1/top-5 (a top-k over the vocabulary: skip it on steps that do not log).
    """
    results = [
        medusa_head_loss(head_logits[head], input_ids, loss_mask, head, accuracy=accuracy)
        for head in range(head_logits.shape[0])
    ]
    return stack_head_losses(results)


def medusa_head_loss(
    inputs: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    head: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    accuracy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Medusa head ``head``'s cross-entropy against token t + 2 + k, projected in chunks (:func:`linear_cross_entropy`).

    Args:
        inputs: ``[B, T, H]`` what the head's vocabulary projection reads, or ``[B, T, V]`` logits (``weight`` None).
        input_ids, loss_mask: ``[B, T]``.
        head: 0-based head index k.
        weight, bias: the head's projection ``[V, H]`` / ``[V]`` (:meth:`MedusaHeads.projection`).
        accuracy: also compute top-1/top-5 (NaN otherwise).

    Returns:
        ``(loss, top1, top5, count)`` scalars; a head with no counted target gives zeros, the loss still connected to
        the graph.
    """
    targets, mask = head_targets(input_ids, loss_mask, head)
    rows = flat_rows(mask, inputs.shape[1])
    vocab = inputs.shape[-1] if weight is None else weight.shape[0]
    top_k = min(5, vocab) if accuracy else 0
    flat = inputs.reshape(-1, inputs.shape[-1])
    wanted = targets[mask]  # [M]
    scored = linear_cross_entropy(flat, weight, wanted, rows=rows, bias=bias, top_k=top_k)
    loss, top = scored.loss, scored.top
    count = torch.tensor(float(wanted.numel()), device=inputs.device)
    if not accuracy:
        nan = torch.full((), float("nan"), device=inputs.device)
        return loss, nan, nan, count
    if wanted.numel() == 0:
        zero = torch.zeros((), device=inputs.device)
        return loss, zero, zero, count
    top1 = (top[:, 0] == wanted).float().mean()
    top5 = (top == wanted[:, None]).any(dim=-1).float().mean()
    return loss, top1, top5, count


def stack_head_losses(results: list[tuple[torch.Tensor, ...]]) -> HeadLosses:
    """:class:`HeadLosses` from one :func:`medusa_head_loss` result per head."""
    loss, top1, top5, count = (torch.stack(values) for values in zip(*results, strict=True))
    return HeadLosses(loss, top1, top5, count)


def medusa2_head_weights(num_heads: int, weight: float, decay: float, schedule: float) -> torch.Tensor:
    """Medusa-2 head weights ``w0 * decay^k * schedule`` for k = 0..K-1."""
    return weight * schedule * decay ** torch.arange(num_heads, dtype=torch.float32)
