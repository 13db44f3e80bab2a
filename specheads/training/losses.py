"""Training losses shared by the methods: small pure functions over tensors, with the alignment written out.

The base's lm_head at position t predicts token t + 1. A target counts only when its own ``loss_mask`` is 1
(assistant tokens in chats, real tokens rather than padding). The methods' own losses live in their folders
(Medusa's heads in :mod:`specheads.methods.medusa.losses`, EAGLE's unrolled steps in
:mod:`specheads.methods.eagle.losses`), built on the pieces here.

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


def flat_rows(mask: torch.Tensor, length: int) -> torch.Tensor:
    """``[M]`` row indices, into a ``[B, length, ...]`` tensor flattened to ``[B * length, ...]``, of ``mask``'s
    True positions ``[B, T']`` (``T' <= length``: positions ``0 .. T' - 1``), in ``tensor[mask]`` order."""
    batch_index, position = mask.nonzero(as_tuple=True)
    return batch_index * length + position


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of the base itself (position t predicts t + 1) over counted targets (in chunks)."""
    targets, mask = input_ids[:, 1:], loss_mask[:, 1:].bool()
    rows = flat_rows(mask, logits.shape[1])
    flat = logits.reshape(-1, logits.shape[-1])
    return linear_cross_entropy(flat, None, targets[mask], rows=rows).loss


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """KL(teacher || student) per predicted position, averaged over positions whose target counts (in chunks).

    Medusa-2's self-distillation keeps the fine-tuned base's distribution close to the original base's.
    """
    mask = loss_mask[:, 1:].bool()
    rows = flat_rows(mask, student_logits.shape[1])
    vocab = student_logits.shape[-1]
    teacher = TeacherLogits(teacher_logits.reshape(-1, vocab), rows=rows)
    return linear_cross_entropy(student_logits.reshape(-1, vocab), None, teacher, rows=rows, kl=True).loss


# ------------------------------------------------------------------------------------------- chunked projections
@dataclass
class TeacherLogits:
    """Soft targets: the distribution ``softmax(logits[rows][:, columns])`` for each scored position.

    Attributes:
        logits: ``[N, V]`` a teacher's logits (e.g. the base's, flattened over batch and positions), any dtype; with
            ``projection``, ``[N, H]`` the hidden states they are projected from.
        rows: ``[M]`` the row of ``logits`` that is each scored position's target (None: row m for position m).
        columns: ``[Vd]`` the vocabulary the student predicts, as columns of ``logits`` (None: all); the softmax over
            these columns is the teacher's distribution renormalised onto them.
        projection: ``(weight [V, H], bias [V] or None)`` of a plain linear lm_head: a chunk's logits are projected
            from its hidden states as it is scored (only ``columns``' rows of the weight), so the teacher's
            ``[N, V]`` logits never exist whole.
    """

    logits: torch.Tensor
    rows: torch.Tensor | None = None
    columns: torch.Tensor | None = None
    projection: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def __post_init__(self) -> None:
        if self.projection is not None and self.columns is not None:  # the draft vocabulary's rows, taken once
            weight, bias = self.projection
            self.projection = (weight[self.columns], None if bias is None else bias[self.columns])
            self.columns = None

    def __len__(self) -> int:
        """The number of scored positions."""
        return self.logits.shape[0] if self.rows is None else self.rows.numel()

    def chunk_logits(self, start: int, end: int) -> torch.Tensor:
        """``[end - start, Vd]`` the teacher's logits of positions ``start .. end - 1`` (in their own dtype)."""
        selected = self.logits[start:end] if self.rows is None else self.logits[self.rows[start:end]]
        if self.projection is not None:
            weight, bias = self.projection
            return F.linear(selected.to(weight.dtype), weight, bias)
        return selected if self.columns is None else selected[:, self.columns]

    def probabilities(self, start: int, end: int) -> torch.Tensor:
        """``[end - start, Vd]`` fp32 target distributions of positions ``start .. end - 1``."""
        return self.chunk_logits(start, end).float().softmax(dim=-1)

    @torch.no_grad()
    def greedy(self) -> torch.Tensor:
        """``[M]`` each scored position's highest-logit column (an index into ``columns``, or a token id), a chunk
        of positions at a time (about :data:`CHUNK_ELEMENTS` logits each)."""
        count = len(self)
        width = self.projection[0].shape[0] if self.projection is not None else (
            self.logits.shape[-1] if self.columns is None else self.columns.numel()
        )  # fmt: skip
        chunk = max(1, CHUNK_ELEMENTS // max(width, 1))
        parts = [self.chunk_logits(start, min(start + chunk, count)).argmax(dim=-1) for start in range(0, count, chunk)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=self.logits.device)


@dataclass
class ProjectedLoss:
    """What :func:`linear_cross_entropy` returns."""

    loss: torch.Tensor  # fp32 scalar: sum over rows of row_weight * row loss (by default the mean)
    row_losses: torch.Tensor  # [M] each scored row's cross-entropy (KL with kl=True; + tv_weight * TV), detached
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
    tv_weight: float = 0.0


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
    tv_weight: float = 0.0,
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
        tv_weight: soft targets: add ``tv_weight * TV(p, q)`` to each row's loss, the total variation
            ``0.5 * sum |p - q|``: one minus the rate at which rejection sampling accepts a token drafted from ``q``
            for a target ``p``, the quantity drafting wants small (cross-entropy bounds it only loosely).

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
    if tv_weight and not isinstance(targets, TeacherLogits):
        raise ValueError("tv_weight needs soft targets (TeacherLogits): against one id it is 1 - q(id)")
    chunk = chunk_rows or max(1, CHUNK_ELEMENTS // vocab)
    scoring = _Scoring(targets, rows, row_weights.float(), top_k, kl, chunk, float(tv_weight))
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
            probs = log_probs.exp_()
            # d row loss / d logits: softmax - p (in place unless the TV term still needs the softmax)
            gradient = probs - wanted if scoring.tv_weight else probs.sub_(wanted)
            if scoring.tv_weight:  # TV = 0.5 * sum |q - p|; d TV / d logits = q * (g - <g, q>), g = 0.5 * sign(q - p)
                row_losses[start:end] += scoring.tv_weight * 0.5 * gradient.abs().sum(dim=-1)
                half_sign = gradient.sign().mul_(0.5)
                half_sign.sub_((half_sign * probs).sum(dim=-1, keepdim=True)).mul_(probs)
                gradient.add_(half_sign, alpha=scoring.tv_weight)
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
