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


# ------------------------------------------------------------------------------------------------------------ EAGLE
# EAGLE (Li et al. 2024): the draft at sequence position t reads token t + 1 and the feature of position t. Unrolled
# step i (0-based) at position t predicts token t + 2 + i, whose distribution under the base is its logits at
# position t + 1 + i. Positions whose target lies past the sequence, or whose target token does not count
# (``loss_mask``), are left out.


def eagle_targets(
    base_logits: torch.Tensor | None,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    step: int,
    draft_ids: torch.Tensor | None = None,
    corpus: bool = False,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets of unrolled draft step ``step`` at positions ``t = 0 .. T - 2``.

    Args:
        base_logits: ``[B, T, V]`` the base's logits over the same sequence (self-distillation targets).
        input_ids: ``[B, T]``.
        loss_mask: ``[B, T]`` 1 where a token may be a target.
        step: unrolled step i: position t predicts token t + 2 + i.
        draft_ids: ``[Vd]`` target ids of a reduced draft vocabulary (None: the whole vocabulary).
        corpus: hard targets (the data's tokens) instead of the base's distribution.
        vocab_size: the base's vocabulary size (needed for corpus targets over a reduced draft vocabulary).

    Returns:
        ``(targets, mask)``: ``targets`` is ``[B, T - 1, Vd]`` probabilities (renormalised over the draft
        vocabulary) or ``[B, T - 1]`` draft ids when ``corpus``; ``mask`` is ``[B, T - 1]`` bool.
    """
    batch, length = input_ids.shape
    span, count = length - 1, max(length - 2 - step, 0)  # t + 2 + i <= T - 1
    mask = torch.zeros(batch, span, dtype=torch.bool, device=input_ids.device)
    mask[:, :count] = loss_mask[:, 2 + step :].bool()
    if corpus:
        wanted = torch.zeros(batch, span, dtype=torch.long, device=input_ids.device)
        wanted[:, :count] = input_ids[:, 2 + step :]
        if draft_ids is not None:  # target id -> draft id; tokens outside the draft vocabulary do not count
            size = vocab_size if vocab_size is not None else int(base_logits.shape[-1])
            lookup = torch.full((size,), -1, dtype=torch.long, device=input_ids.device)
            lookup[draft_ids] = torch.arange(draft_ids.numel(), device=input_ids.device)
            wanted = lookup[wanted]
            mask &= wanted >= 0
            wanted = wanted.clamp_min(0)
        return wanted, mask
    probs = torch.zeros(batch, span, base_logits.shape[-1], device=base_logits.device)
    probs[:, :count] = base_logits[:, 1 + step : 1 + step + count].float().softmax(dim=-1)
    if draft_ids is not None:
        probs = probs[..., draft_ids]
        probs = probs / probs.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    return probs, mask


def draft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over masked positions; soft targets ``[..., Vd]`` or hard ids ``[...]``."""
    if not bool(mask.any()):
        return logits.sum() * 0.0
    log_probs = F.log_softmax(logits[mask].float(), dim=-1)  # [M, Vd]
    if targets.dim() == logits.dim():
        return -(targets[mask] * log_probs).sum(dim=-1).mean()
    return F.nll_loss(log_probs, targets[mask])


def eagle1_loss(
    draft_hidden: torch.Tensor,
    draft_logits: torch.Tensor,
    features: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    feature_weight: float = 1.0,
    ce_weight: float = 0.1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """EAGLE-1: ``feature_weight * SmoothL1(draft output at t, feature of t + 1) + ce_weight * CE``.

    Args:
        draft_hidden: ``[B, T - 1, H]`` step-0 draft outputs.
        draft_logits: ``[B, T - 1, V]`` their logits through the base's lm_head.
        features: ``[B, T, H]`` the base's features (the same kind the draft reads).
        targets, mask: from :func:`eagle_targets` with ``step=0``.
    """
    if not bool(mask.any()):
        zero = draft_hidden.sum() * 0.0
        return zero, {"feature_loss": zero.detach(), "ce_loss": zero.detach()}
    wanted = features[:, 1:].float()  # the feature of position t + 1
    feature_loss = F.smooth_l1_loss(draft_hidden[mask].float(), wanted[mask])
    ce = draft_cross_entropy(draft_logits, targets, mask)
    return feature_weight * feature_loss + ce_weight * ce, {
        "feature_loss": feature_loss.detach(),
        "ce_loss": ce.detach(),
    }


def ttt_weights(steps: int, decay: float) -> torch.Tensor:
    """EAGLE-3's weights ``decay^i`` of the unrolled steps i = 0 .. steps - 1."""
    return decay ** torch.arange(steps, dtype=torch.float32)
