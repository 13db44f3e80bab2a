"""Training losses: small pure functions over tensors, with the alignment written out.

Medusa (Cai et al. 2024): the base's lm_head at position t predicts token t + 1; Medusa head k (0-based) at position
t predicts token t + 2 + k. A target counts only when its own ``loss_mask`` is 1 (assistant tokens in chats, real
tokens rather than padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


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
    losses, top1, top5, counts = [], [], [], []
    for head in range(head_logits.shape[0]):
        targets, mask = head_targets(input_ids, loss_mask, head)
        logits = head_logits[head, :, : targets.shape[1]][mask]  # [M, V]
        wanted = targets[mask]  # [M]
        count = wanted.numel()
        if count == 0:  # a batch too short for this head: contributes nothing, keeps the graph connected
            zero = head_logits[head].sum() * 0.0
            losses.append(zero)
            top1.append(zero.detach())
            top5.append(zero.detach())
        else:
            losses.append(F.cross_entropy(logits.float(), wanted))
            if not accuracy:
                top1.append(torch.full((), float("nan"), device=logits.device))
                top5.append(torch.full((), float("nan"), device=logits.device))
                counts.append(torch.tensor(float(count), device=head_logits.device))
                continue
            with torch.no_grad():
                best = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # [M, 5]
                top1.append((best[:, 0] == wanted).float().mean())
                top5.append((best == wanted[:, None]).any(dim=-1).float().mean())
        counts.append(torch.tensor(float(count), device=head_logits.device))
    return HeadLosses(torch.stack(losses), torch.stack(top1), torch.stack(top5), torch.stack(counts))


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of the base itself (position t predicts t + 1) over counted targets."""
    targets, mask = input_ids[:, 1:], loss_mask[:, 1:].bool()
    selected = logits[:, :-1][mask]  # [M, V]
    if selected.numel() == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(selected.float(), targets[mask])


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """KL(teacher || student) per predicted position, averaged over positions whose target counts.

    Medusa-2's self-distillation keeps the fine-tuned base's distribution close to the original base's.
    """
    mask = loss_mask[:, 1:].bool()
    student = F.log_softmax(student_logits[:, :-1][mask].float(), dim=-1)  # [M, V]
    teacher = F.log_softmax(teacher_logits[:, :-1][mask].float(), dim=-1)
    if student.numel() == 0:
        return student_logits.sum() * 0.0
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")


def medusa2_head_weights(num_heads: int, weight: float, decay: float, schedule: float) -> torch.Tensor:
    """Medusa-2 head weights ``w0 * decay^k * schedule`` for k = 0..K-1."""
    return weight * schedule * decay ** torch.arange(num_heads, dtype=torch.float32)
