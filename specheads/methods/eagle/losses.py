"""EAGLE's losses: the unrolled draft steps' cross-entropy (EAGLE-3's training-time test) and EAGLE-1's feature
regression.

EAGLE (Li et al. 2024): the draft at sequence position t reads token t + 1 and the feature of position t. Unrolled
step i (0-based) at position t predicts token t + 2 + i, whose distribution under the base is its logits at
position t + 1 + i. Positions whose target lies past the sequence, or whose target token does not count
(``loss_mask``), are left out. Every step's vocabulary projection is scored a chunk of positions at a time
(:func:`~specheads.training.losses.linear_cross_entropy`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specheads.methods.api import TeacherLogits, flat_rows, linear_cross_entropy


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

    Soft targets are whole ``[B, T - 1, Vd]`` distributions, for reference and small vocabularies: training scores
    the same targets a chunk of positions at a time (:func:`eagle_loss`).

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
    mask = eagle_mask(loss_mask, step)
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


def eagle_mask(loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """``[B, T - 1]`` bool: the positions t whose step-``step`` target, token t + 2 + step, exists and counts."""
    batch, length = loss_mask.shape
    mask = torch.zeros(batch, length - 1, dtype=torch.bool, device=loss_mask.device)
    mask[:, : max(length - 2 - step, 0)] = loss_mask[:, 2 + step :].bool()
    return mask


@dataclass
class UnrolledLosses:
    """What :func:`eagle_loss` returns; lists hold one entry per unrolled step."""

    loss: torch.Tensor  # sum_i step_weights[i] * step_losses[i], connected to the graph
    step_losses: list[torch.Tensor]  # each step's mean cross-entropy over its counted positions (detached)
    masks: list[torch.Tensor]  # [B, T - 1] each step's counted positions
    tops: list[torch.Tensor] | None  # [M_i, top_k] each step's top draft ids at its counted positions, in order


def eagle_loss(
    step_inputs: list[torch.Tensor],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    step_weights: torch.Tensor,
    base_logits: torch.Tensor | None,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    draft_ids: torch.Tensor | None = None,
    corpus: bool = False,
    vocab_size: int | None = None,
    top_k: int = 0,
    tv_weight: float = 0.0,
) -> UnrolledLosses:
    """``sum_i step_weights[i] * CE_i`` of the unrolled draft steps, all projected in one chunked call.

    ``CE_i`` equals ``draft_cross_entropy(F.linear(step_inputs[i], weight, bias), *eagle_targets(..., step=i))``,
    without any ``[B, T - 1, V]`` logits or target distributions: each chunk of positions reads its rows of
    ``base_logits`` (the draft vocabulary's columns, renormalised) as :class:`TeacherLogits`, and the steps share
    one gradient of ``weight``.

    Args:
        step_inputs: per step, ``[B, T - 1, D]`` what the draft's vocabulary projection reads
            (:meth:`EagleHead.projection`); ``weight``, ``bias``: that projection.
        step_weights: ``[S]`` the steps' weights (EAGLE-3: :func:`ttt_weights`).
        base_logits: ``[B, T, V]`` the base's logits, or ``[B, T, Vd]`` those of the draft vocabulary alone (its
            columns ``draft_ids``, in that order; :func:`~specheads.training.features.teacher_logits`); not needed
            for corpus targets.
        input_ids, loss_mask: ``[B, T]``.
        draft_ids, corpus, vocab_size: as for :func:`eagle_targets`.
        top_k: also return the draft's top ids (draft vocabulary) at the counted positions.
        tv_weight: add this much of the total variation between the base's and the draft's distributions to each
            position's cross-entropy (an acceptance-targeted term; soft targets only).

    Returns:
        :class:`UnrolledLosses`; a step with no counted position adds 0.
    """
    batch, span = input_ids.shape[0], input_ids.shape[1] - 1
    masks, student_rows, targets, row_weights = [], [], [], []
    for step in range(len(step_inputs)):
        if corpus:
            wanted, mask = eagle_targets(None, input_ids, loss_mask, step, draft_ids, True, vocab_size)
            targets.append(wanted[mask])
        else:
            mask = eagle_mask(loss_mask, step)
            batch_index, position = mask.nonzero(as_tuple=True)
            targets.append(batch_index * (span + 1) + position + 1 + step)  # the base's logits at t + 1 + step
        rows = flat_rows(mask, span) + step * batch * span  # into the steps' inputs, concatenated
        masks.append(mask)
        student_rows.append(rows)
        row_weights.append(torch.full((rows.numel(),), float(step_weights[step]) / max(rows.numel(), 1)))
    rows = torch.cat(student_rows)
    wanted = torch.cat(targets)
    if not corpus:
        restricted = draft_ids is not None and base_logits.shape[-1] == draft_ids.numel()
        columns = None if restricted else draft_ids
        wanted = TeacherLogits(base_logits.reshape(-1, base_logits.shape[-1]), wanted, columns)
    inputs = torch.cat([step.reshape(-1, step.shape[-1]) for step in step_inputs])  # [S * B * (T - 1), D]
    weights = torch.cat(row_weights).to(inputs.device)
    scored = linear_cross_entropy(inputs, weight, wanted, rows, bias, weights, top_k, tv_weight=tv_weight)
    sizes = [r.numel() for r in student_rows]
    step_losses = [part.mean() if part.numel() else part.sum() for part in scored.row_losses.split(sizes)]
    tops = list(scored.top.split(sizes)) if top_k else None
    return UnrolledLosses(scored.loss, step_losses, masks, tops)


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
    features: torch.Tensor,
    mask: torch.Tensor,
    ce: torch.Tensor,
    feature_weight: float = 1.0,
    ce_weight: float = 0.1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """EAGLE-1: ``feature_weight * SmoothL1(draft output at t, feature of t + 1) + ce_weight * CE``.

    Args:
        draft_hidden: ``[B, T - 1, H]`` step-0 draft outputs.
        features: ``[B, T, H]`` the base's features (the same kind the draft reads).
        mask: ``[B, T - 1]`` the counted positions (:func:`eagle_mask` with ``step=0``).
        ce: the step-0 cross-entropy through the base's lm_head (:func:`eagle_loss` or :func:`draft_cross_entropy`).
    """
    if not bool(mask.any()):
        zero = draft_hidden.sum() * 0.0 + ce * 0.0
        return zero, {"feature_loss": zero.detach(), "ce_loss": zero.detach()}
    wanted = features[:, 1:].float()  # the feature of position t + 1
    feature_loss = F.smooth_l1_loss(draft_hidden[mask].float(), wanted[mask])
    return feature_weight * feature_loss + ce_weight * ce, {
        "feature_loss": feature_loss.detach(),
        "ce_loss": ce.detach(),
    }


def ttt_weights(steps: int, decay: float) -> torch.Tensor:
    """EAGLE-3's weights ``decay^i`` of the unrolled steps i = 0 .. steps - 1."""
    return decay ** torch.arange(steps, dtype=torch.float32)
