"""Training losses: small pure functions over tensors, with the alignment written out.

Medusa (Cai et al. 2024): the base's lm_head at position t predicts token t + 1; Medusa head k (0-based) at position
t predicts token t + 2 + k. A target counts only when its own ``loss_mask`` is 1 (assistant tokens in chats, real
tokens rather than padding).

Full-vocabulary losses are computed a chunk of positions at a time (:func:`linear_cross_entropy`): a head's
vocabulary projection, the softmax and the gradients exist for one chunk at once, never as ``[B, T, V]`` tensors
(at V = 49,152 and B * T = 8 * 512 each fp32 copy is 800 MB, and the autograd graph of an unchunked loss holds
several per head or unrolled step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK_ELEMENTS = 2**24  # a chunk of the loss holds about this many logits ([rows, V]: 64 MB in fp32)


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
    rows = _flat_rows(mask, inputs.shape[1])
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


def _flat_rows(mask: torch.Tensor, length: int) -> torch.Tensor:
    """``[M]`` row indices, into a ``[B, length, ...]`` tensor flattened to ``[B * length, ...]``, of ``mask``'s
    True positions ``[B, T']`` (``T' <= length``: positions ``0 .. T' - 1``), in ``tensor[mask]`` order."""
    batch_index, position = mask.nonzero(as_tuple=True)
    return batch_index * length + position


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of the base itself (position t predicts t + 1) over counted targets (in chunks)."""
    targets, mask = input_ids[:, 1:], loss_mask[:, 1:].bool()
    rows = _flat_rows(mask, logits.shape[1])
    flat = logits.reshape(-1, logits.shape[-1])
    return linear_cross_entropy(flat, None, targets[mask], rows=rows).loss


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """KL(teacher || student) per predicted position, averaged over positions whose target counts (in chunks).

    Medusa-2's self-distillation keeps the fine-tuned base's distribution close to the original base's.
    """
    mask = loss_mask[:, 1:].bool()
    rows = _flat_rows(mask, student_logits.shape[1])
    vocab = student_logits.shape[-1]
    teacher = TeacherLogits(teacher_logits.reshape(-1, vocab), rows=rows)
    return linear_cross_entropy(student_logits.reshape(-1, vocab), None, teacher, rows=rows, kl=True).loss


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
        rows = _flat_rows(mask, span) + step * batch * span  # into the steps' inputs, concatenated
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
    scored = linear_cross_entropy(inputs, weight, wanted, rows, bias, weights, top_k)
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


# ------------------------------------------------------------------------------------------- chunked projections
@dataclass
class TeacherLogits:
    """Soft targets: the distribution ``softmax(logits[rows][:, columns])`` for each scored position.

    Attributes:
        logits: ``[N, V]`` a teacher's logits (e.g. the base's, flattened over batch and positions), any dtype.
        rows: ``[M]`` the row of ``logits`` that is each scored position's target (None: row m for position m).
        columns: ``[Vd]`` the vocabulary the student predicts, as columns of ``logits`` (None: all); the softmax over
            these columns is the teacher's distribution renormalised onto them.
    """

    logits: torch.Tensor
    rows: torch.Tensor | None = None
    columns: torch.Tensor | None = None

    def probabilities(self, start: int, end: int) -> torch.Tensor:
        """``[end - start, Vd]`` fp32 target distributions of positions ``start .. end - 1``."""
        logits = self.logits[start:end] if self.rows is None else self.logits[self.rows[start:end]]
        if self.columns is not None:
            logits = logits[:, self.columns]
        return logits.float().softmax(dim=-1)


@dataclass
class ProjectedLoss:
    """What :func:`linear_cross_entropy` returns."""

    loss: torch.Tensor  # fp32 scalar: sum over rows of row_weight * row loss (by default the mean)
    row_losses: torch.Tensor  # [M] each scored row's cross-entropy (KL with kl=True), detached
    top: torch.Tensor | None  # [M, top_k] each row's highest-logit ids, or None


@dataclass
class _Scoring:
    """The non-tensor arguments of :class:`_LinearCrossEntropy` (see :func:`linear_cross_entropy`)."""

    targets: torch.Tensor | TeacherLogits
    rows: torch.Tensor | None
    row_weights: torch.Tensor
    top_k: int
    kl: bool
    chunk: int


def linear_cross_entropy(
    inputs: torch.Tensor,
    weight: torch.Tensor | None,
    targets: torch.Tensor | TeacherLogits,
    rows: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    row_weights: torch.Tensor | None = None,
    top_k: int = 0,
    kl: bool = False,
    chunk_rows: int | None = None,
) -> ProjectedLoss:
    """Cross-entropy of ``F.linear(inputs[rows], weight, bias)`` against ``targets``, a chunk of rows at a time.

    Equal to ``F.cross_entropy(F.linear(inputs[rows], weight, bias).float(), targets)`` (soft targets:
    ``-(p * log_softmax(logits)).sum(-1).mean()``), gradients included, but no ``[M, V]`` tensor outlives its chunk:
    each chunk's gradients are computed as it is scored (softmax minus target) and only the ``[N, D]`` / ``[V, D]``
    gradients wait for the backward pass. Several losses through one weight (EAGLE-3's unrolled steps) belong in
    one call, with ``row_weights``: separate calls would each hold a ``[V, D]`` gradient until the backward.
    Matmuls run in the dtype ``F.linear`` picks (autocast included), the softmax in fp32.

    Args:
        inputs: ``[N, D]`` what the projection reads, or ``[N, V]`` logits when ``weight`` is None.
        weight: ``[V, D]`` the vocabulary projection (None: ``inputs`` are the logits).
        targets: ``[M]`` target ids, or :class:`TeacherLogits` (soft targets).
        rows: ``[M]`` the rows of ``inputs`` scored (None: all, M = N).
        bias: ``[V]`` the projection's bias.
        row_weights: ``[M]`` each row's weight in the loss (default ``1 / M``: the mean).
        top_k: also return each scored row's ``top_k`` highest-logit ids (accuracy metrics; 0: none).
        kl: soft targets: ``KL(p || q)`` instead of the cross-entropy (lower by the targets' entropy; same gradients).
        chunk_rows: rows per chunk (default: about :data:`CHUNK_ELEMENTS` logits per chunk).

    Returns:
        :class:`ProjectedLoss`; with no row the loss is 0, still connected to the graph.
    """
    count = inputs.shape[0] if rows is None else rows.numel()
    vocab = inputs.shape[-1] if weight is None else weight.shape[0]
    device = inputs.device
    top = torch.zeros(count, top_k, dtype=torch.long, device=device) if top_k else None
    if count == 0:
        zero = inputs.sum() * 0.0 + (weight.sum() * 0.0 if weight is not None else 0.0)
        return ProjectedLoss(zero.float(), torch.zeros(0, device=device), top)
    if row_weights is None:
        row_weights = torch.full((count,), 1.0 / count, device=device)
    scoring = _Scoring(targets, rows, row_weights.float(), top_k, kl, chunk_rows or max(1, CHUNK_ELEMENTS // vocab))
    loss, row_losses, top = _LinearCrossEntropy.apply(inputs, weight, bias, scoring)
    return ProjectedLoss(loss, row_losses, top if top_k else None)


def projected_top_k(
    inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, k: int, chunk_rows: int | None = None
) -> torch.Tensor:
    """``[..., k]`` the ids of the ``k`` highest logits ``F.linear(inputs, weight, bias)``, a chunk of rows at a time.

    For evaluation: only a chunk's ``[rows, V]`` logits exist at once. ``inputs`` is ``[..., D]``.
    """
    flat = inputs.reshape(-1, inputs.shape[-1])
    chunk = chunk_rows or max(1, CHUNK_ELEMENTS // weight.shape[0])
    top = torch.empty(flat.shape[0], k, dtype=torch.long, device=inputs.device)
    for start in range(0, flat.shape[0], chunk):
        top[start : start + chunk] = F.linear(flat[start : start + chunk], weight, bias).topk(k, dim=-1).indices
    return top.reshape(*inputs.shape[:-1], k)


class _LinearCrossEntropy(torch.autograd.Function):
    """:func:`linear_cross_entropy`'s autograd: gradients computed chunk by chunk in forward, scaled in backward."""

    @staticmethod
    def forward(ctx, inputs, weight, bias, scoring):  # noqa: ANN001, ANN205
        wants = ctx.needs_input_grad[:3]  # (inputs, weight, bias); all False under no_grad / inference_mode
        loss, row_losses, top, ctx.grads = _score_chunks(inputs, weight, bias, scoring, wants)
        ctx.mark_non_differentiable(row_losses, top)
        return loss, row_losses, top

    @staticmethod
    def backward(ctx, grad_loss, grad_rows, grad_top):  # noqa: ANN001, ANN205
        grads = [None if grad is None else grad * grad_loss.to(grad.dtype) for grad in ctx.grads]
        ctx.grads = None
        return (*grads, None)


def _score_chunks(
    inputs: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    scoring: _Scoring,
    wants: tuple[bool, bool, bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
    """The weighted loss, the row losses, the top ids and the gradients of inputs, weight and bias (None: unwanted)."""
    rows, targets, top_k = scoring.rows, scoring.targets, scoring.top_k
    count = inputs.shape[0] if rows is None else rows.numel()
    row_losses = torch.zeros(count, dtype=torch.float32, device=inputs.device)
    top = torch.zeros(count if top_k else 0, top_k, dtype=torch.long, device=inputs.device)
    grads = [
        torch.zeros_like(inputs) if wants[0] else None,
        torch.zeros_like(weight, dtype=torch.float32) if wants[1] else None,
        torch.zeros_like(bias, dtype=torch.float32) if wants[2] else None,
    ]
    for start in range(0, count, scoring.chunk):
        end = min(start + scoring.chunk, count)
        index = slice(start, end) if rows is None else rows[start:end]
        selected = inputs[index]  # [c, D]
        logits = selected if weight is None else F.linear(selected, weight, bias)  # [c, V]
        log_probs = logits.float().log_softmax(dim=-1)
        if top_k:
            top[start:end] = logits.topk(top_k, dim=-1).indices
        if isinstance(targets, TeacherLogits):
            wanted = targets.probabilities(start, end)  # [c, V]
            row_losses[start:end] = -(wanted * log_probs).sum(dim=-1)
            if scoring.kl:
                row_losses[start:end] += torch.xlogy(wanted, wanted).sum(dim=-1)
            gradient = log_probs.exp_().sub_(wanted)  # d row loss / d logits: softmax - p
        else:
            wanted = targets[start:end]
            row_losses[start:end] = -log_probs.gather(1, wanted[:, None])[:, 0]
            gradient = log_probs.exp_()
            gradient[torch.arange(end - start, device=gradient.device), wanted] -= 1.0
        if any(wants):
            gradient = gradient.mul_(scoring.row_weights[start:end, None]).to(logits.dtype)
            _accumulate(grads, gradient, selected, weight, index)
    if grads[1] is not None:
        grads[1] = grads[1].to(weight.dtype)
    if grads[2] is not None:
        grads[2] = grads[2].to(bias.dtype)
    return (row_losses * scoring.row_weights).sum(), row_losses, top, grads


def _accumulate(
    grads: list[torch.Tensor | None],
    gradient: torch.Tensor,
    selected: torch.Tensor,
    weight: torch.Tensor | None,
    index: slice | torch.Tensor,
) -> None:
    """Add one chunk's ``d loss / d logits`` ``[c, V]`` to the gradients of inputs, weight and bias.

    Outside autocast ``gradient``, ``selected`` and ``weight`` share a dtype (``F.linear`` required it); inside, the
    matmuls autocast as the forward projection did.
    """
    grad_inputs, grad_weight, grad_bias = grads
    if grad_inputs is not None:
        chunk_grad = (gradient if weight is None else gradient @ weight).to(grad_inputs.dtype)  # [c, D]
        if isinstance(index, slice):
            grad_inputs[index] += chunk_grad
        else:
            grad_inputs.index_add_(0, index, chunk_grad)
    if grad_weight is not None:
        grad_weight += (gradient.T @ selected).float()
    if grad_bias is not None:
        grad_bias += gradient.sum(dim=0).float()
