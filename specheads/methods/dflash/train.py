"""Block drafters' part of the trainer: building heads, the loss of one micro-batch and the held-out evaluation.

The base stays frozen and in the loop: one forward per micro-batch gives the features of every position (the
context) and the targets. Per sequence, ``heads.num_anchors`` anchors are drawn uniformly, without replacement,
over the positions whose first draft target is a training target (a real token under the loss mask); the block of
anchor a is ``[x_a, mask, ...]`` at positions ``a, a + 1, ...`` and sees the context at positions ``< a`` of its
own sequence (a row is one document) and its own block, all blocks of a batch in one dense-masked forward.

Draft depth d (1 .. D) of the block at a drafts the token at ``a + d``: its target is the base's distribution at
position ``a + d - 1`` (self-distillation) or the data's token at ``a + d``. It sits in slot d (DFlash: slot 0 is
the anchor) or slot d - 1 (DSpark, ``sample_from_anchor``). Depths count while their targets form a contiguous run
of training targets inside the sequence (DeepSpec's rule). DSpark's Markov head reads the true previous token
(teacher forcing): the anchor for depth 1, the data's token at ``a + d - 1`` after it.

Anchors come from a generator seeded by the recipe's seed, the epoch and the row's tokens, so a resumed run and a
run on more processes draw the same anchors for the same rows.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from specheads.methods.api import (
    RANKS,
    BaseView,
    Evaluation,
    StepContext,
    StepResult,
    agreement_summary,
)
from specheads.methods.dflash.config import DFlashHeadsConfig
from specheads.methods.dflash.heads import DFlashHead

EVAL_ANCHORS = 128  # anchors per held-out sequence, evenly spaced over its valid positions
TREE_BUDGETS = (4, 8, 16, 32)  # DDTree node budgets whose tau the evaluation estimates
TREE_TAU_BLOCKS = 512  # blocks the DDTree tau estimate walks (a Python heap per block and budget)


def build_heads(base: torch.nn.Module, section: DFlashHeadsConfig, dataset: Any) -> DFlashHead:
    """A fresh fp32 block drafter sized for ``base`` (default mask token: the base's pad, else eos)."""
    return DFlashHead.from_base(
        base,
        variant=section.variant,
        layer_ids=section.layer_ids,
        num_layers=section.num_layers,
        block_size=section.block_size,
        mask_token_id=section.mask_token_id,
        markov_rank=section.markov_rank,
        confidence_head=section.confidence_head,
    ).float()


def valid_anchors(loss_mask: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: position a can anchor a block (its first target, the token at a + 1, is a real target)."""
    targets = loss_mask.bool() & attention_mask.bool()
    valid = torch.zeros_like(targets)
    valid[:, :-1] = targets[:, 1:] & attention_mask[:, :-1].bool()
    return valid


def row_seed(seed: int, epoch: int, input_ids: torch.Tensor) -> int:
    """A seed that depends only on the recipe's seed, the epoch and the row's tokens."""
    ids = input_ids.long().cpu()
    weights = torch.arange(1, ids.numel() + 1, dtype=torch.long) % 65521 + 1
    return int((seed * 1_000_003 + epoch * 7919 + int((ids * weights).sum())) % (2**62))


def sample_anchors(
    valid: torch.Tensor, count: int, seeds: list[int] | None = None, spread: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` anchors per row among its ``valid`` positions, sorted.

    Uniform without replacement (``seeds``: one generator seed per row), or evenly spaced (``spread``). A row with
    fewer valid positions takes them all. Returns ``(anchors [B, N], used [B, N])``; unused entries repeat anchor
    0 and are masked out.
    """
    batch = valid.shape[0]
    anchors = torch.zeros(batch, count, dtype=torch.long)
    used = torch.zeros(batch, count, dtype=torch.bool)
    for row in range(batch):
        positions = valid[row].nonzero().squeeze(-1).cpu()
        if positions.numel() > count:
            if spread:
                pick = torch.linspace(0, positions.numel() - 1, count).round().long()
            else:
                generator = torch.Generator().manual_seed(seeds[row] if seeds else row)
                pick = torch.randperm(positions.numel(), generator=generator)[:count].sort().values
            positions = positions[pick]
        anchors[row, : positions.numel()] = positions
        used[row, : positions.numel()] = True
    return anchors.to(valid.device), used.to(valid.device)


def depth_targets(
    head: DFlashHead, input_ids: torch.Tensor, loss_mask: torch.Tensor, attention_mask: torch.Tensor,
    anchors: torch.Tensor, used: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Per anchor and draft depth d = 1..D: the data's token at ``a + d``, the base position ``a + d - 1`` whose
    distribution is the target, and whether the depth counts (a contiguous run of real targets inside the row).

    Returns ``(tokens, teacher_positions, valid)``, each ``[B, N, D]``.
    """
    length = input_ids.shape[1]
    depths = torch.arange(1, head.config.num_drafts + 1, device=input_ids.device)
    positions = anchors[:, :, None] + depths  # [B, N, D] the drafted token's position
    inside = positions < length
    clamped = positions.clamp_max(length - 1)
    targets = (loss_mask.bool() & attention_mask.bool()).gather(1, clamped.flatten(1)).view_as(positions)
    valid = (inside & targets & used[:, :, None]).long().cumprod(dim=-1).bool()
    tokens = input_ids.gather(1, clamped.flatten(1)).view_as(positions)
    return tokens, clamped - 1, valid


def depth_hidden(head: DFlashHead, hidden: torch.Tensor) -> torch.Tensor:
    """``[B, N, D, h]``: the slots that draft depths 1..D, out of ``[B, N, S, h]``."""
    first = head.config.first_slot
    return hidden[:, :, first : first + head.config.num_drafts]


def previous_tokens(head: DFlashHead, input_ids: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """``[B, N, D]`` DSpark's teacher-forced Markov input: the token before each drafted one (``a + d - 1``)."""
    length = input_ids.shape[1]
    positions = anchors[:, :, None] + torch.arange(head.config.num_drafts, device=input_ids.device)
    return input_ids.gather(1, positions.clamp_max(length - 1).flatten(1)).view_as(positions)


def position_weights(section: DFlashHeadsConfig, depth: int, valid: torch.Tensor,
                     confidence: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``[B, N, D]`` loss weights: ``exp(-(d - 1) / gamma)``, or D-PACE from per-depth confidences ``exp(-CE)``."""
    if section.position_weights == "decay" or confidence is None:
        decay = torch.exp(-torch.arange(depth, device=valid.device, dtype=torch.float32) / section.decay_gamma)
        return decay.expand(valid.shape) * valid
    smoothed = torch.where(valid, (1 - section.dpace_alpha) * confidence + section.dpace_alpha, 1.0)
    prefix = smoothed.cumprod(dim=-1)
    suffix = prefix.flip(-1).cumsum(dim=-1).flip(-1)
    return suffix * valid


def block_losses(
    section: DFlashHeadsConfig, head: DFlashHead, logits: torch.Tensor, teacher: torch.Tensor | None,
    tokens: torch.Tensor, valid: torch.Tensor, confidence: torch.Tensor | None, blocks: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """The weighted loss of every counted depth (see :class:`DFlashHeadsConfig`) and its parts.

    The sum is divided by a constant, ``blocks`` (the M blocks by default) times the decay weights of one whole
    block, not by the weights that happen to count: every row's share of the loss is then its own, so that a
    batch split over processes (whose gradients are averaged) trains exactly as on one process.

    Args:
        logits: ``[M, D, V]`` the draft's logits of M blocks.
        teacher: ``[M, D, V]`` the base's logits at each depth's target position (None for pure CE).
        tokens: ``[M, D]`` the data's token at each depth; valid ``[M, D]``.
        confidence: ``[M, D]`` the confidence head's logits, or None.
        blocks: the normaliser's block count (default M).
    """
    loss_name = section.resolved_loss
    log_q = logits.float().log_softmax(dim=-1)
    target_tokens = tokens if section.targets == "corpus" or teacher is None else teacher.argmax(dim=-1)
    ce = -log_q.gather(-1, target_tokens[..., None]).squeeze(-1)  # [M, D]
    parts: dict[str, torch.Tensor] = {}
    p_t = teacher.float().softmax(dim=-1) if teacher is not None else None
    if loss_name == "kl":
        per_depth = (p_t * (p_t.clamp_min(1e-30).log() - log_q)).sum(dim=-1)
    elif loss_name == "ce":
        per_depth = ce
    else:  # DeepSpec's DSpark loss: 0.1 CE to the data + 0.9 L1 to the base
        data_ce = -log_q.gather(-1, tokens[..., None]).squeeze(-1)
        l1 = (log_q.exp() - p_t).abs().sum(dim=-1)
        per_depth = 0.1 * data_ce + 0.9 * l1
        parts["l1"] = l1
    depth = logits.shape[1]
    weights = position_weights(section, depth, valid, torch.exp(-ce).detach())
    decay = position_weights(DFlashHeadsConfig(decay_gamma=section.decay_gamma), depth, valid)
    full = torch.exp(-torch.arange(depth, dtype=torch.float32) / section.decay_gamma).sum()
    total = (logits.shape[0] if blocks is None else blocks) * full
    loss = (weights * per_depth).sum() / total
    parts["per_depth"] = per_depth
    if confidence is not None and p_t is not None:
        tv = 0.5 * (log_q.exp() - p_t).abs().sum(dim=-1)
        target = (1 - tv).detach().clamp(0, 1)
        bce = F.binary_cross_entropy_with_logits(confidence.float(), target, reduction="none")
        confidence_loss = (decay * bce).sum() / total  # the confidence BCE always weighs by the fixed decay
        loss = loss + section.confidence_weight * confidence_loss
        parts["confidence_bce"] = confidence_loss.detach()
    return loss, parts


def train_step(context: StepContext, batch: dict[str, torch.Tensor]) -> StepResult:
    """The loss of one micro-batch (see the module docstring); anchors are drawn from the recipe's seed, the epoch
    and each row's tokens."""
    section: DFlashHeadsConfig = context.section
    head: DFlashHead = context.module
    input_ids = batch["input_ids"].long()
    attention_mask, loss_mask = batch["attention_mask"], batch["loss_mask"]
    # the base's logits are needed only at the blocks' target positions: those alone are projected (teacher_at)
    features, view = context.base_features(batch, head.hidden_state_layers, full_logits=False)
    seeds = [row_seed(context.seed, context.epoch, input_ids[row]) for row in range(input_ids.shape[0])]
    anchors, used = sample_anchors(valid_anchors(loss_mask, attention_mask), section.num_anchors, seeds)
    tokens, teacher_positions, valid = depth_targets(head, input_ids, loss_mask, attention_mask, anchors, used)
    hidden = depth_hidden(head, context.heads(input_ids, features, anchors, attention_mask))  # [B, N, D, h]
    previous = previous_tokens(head, input_ids, anchors) if head.markov_head is not None else None
    logits = head.slot_logits(hidden, previous)
    needs_teacher = section.targets == "self" or section.resolved_loss == "dspark" or head.confidence_head is not None
    batch_index = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None, None]
    teacher = view.teacher_at(batch_index, teacher_positions.clamp_min(0)) if needs_teacher else None  # [B, N, D, V]
    confidence = head.confidence_logits(hidden, previous) if head.confidence_head is not None else None
    loss, parts = block_losses(
        section, head, logits.flatten(0, 1), None if teacher is None else teacher.flatten(0, 1),
        tokens.flatten(0, 1), valid.flatten(0, 1), None if confidence is None else confidence.flatten(0, 1),
    )  # fmt: skip
    metrics = {"block/loss": float(loss.detach()), "block/depths": float(valid.sum()) / max(int(used.sum()), 1)}
    if "confidence_bce" in parts:
        metrics["block/confidence_bce"] = float(parts["confidence_bce"])
    if context.log_metrics:
        with torch.no_grad():
            wanted = teacher if teacher is not None else view.teacher_at(batch_index, teacher_positions.clamp_min(0))
            hits = (logits.argmax(dim=-1) == wanted.argmax(dim=-1)) & valid
            for depth in range(hits.shape[-1]):
                count = int(valid[..., depth].sum())
                if count:
                    metrics[f"depth_{depth + 1}/agreement"] = float(hits[..., depth].sum()) / count
    # the loss is divided by its blocks (every anchor slot of the micro-batch), whatever counts in them
    return StepResult(loss, metrics, weight=anchors.numel())


@torch.inference_mode()
def block_agreement(
    base: torch.nn.Module, head: DFlashHead, batches: Any, max_batches: int | None = None
) -> Evaluation:
    """Per-depth agreement of the block drafter with the base's own greedy token on held-out data.

    Up to :data:`EVAL_ANCHORS` anchors per sequence, evenly spaced; depth d of the block at a counts where the data's
    tokens at ``a + 1 .. a + d - 1`` are the base's greedy tokens (the path the base would have accepted). Also
    ``chain_tau``: the mean accepted length plus one of a greedy chain, measured where the whole block lies on
    such a path or ends where the base's path leaves the data (a lower bound: the walk stops there). ``tree_tau``:
    the same for DDTree trees of :data:`TREE_BUDGETS` nodes built from the block (on the first
    :data:`TREE_TAU_BLOCKS` blocks): the base's greedy path is followed through the tree as far as it goes.

    Returns:
        ``{"agreement_with_base_greedy": [D], "top5_agreement": [D], "accuracy_vs_data": [D],
        "agreement_by_rank": [D][RANKS], "positions": [D], "chain_tau": float, "tree_tau": {budget: float}}``.
    """
    depth = head.config.num_drafts
    ranks = min(RANKS, head.config.vocab_size)
    device = base.get_output_embeddings().weight.device
    by_rank = torch.zeros(depth, ranks, device=device)
    agree, top5, correct, counts = (torch.zeros(depth, device=device) for _ in range(4))
    accepted_total, blocks = 0.0, 0
    tree_accepted, tree_blocks = dict.fromkeys(TREE_BUDGETS, 0), 0
    for index, batch in enumerate(batches):
        if max_batches is not None and index >= max_batches:
            break
        batch = {key: value.to(device) for key, value in batch.items() if isinstance(value, torch.Tensor)}
        input_ids = batch["input_ids"].long()
        attention_mask, loss_mask = batch["attention_mask"], batch["loss_mask"]
        view = BaseView.of(base, batch, full_logits=False)
        features = [view.hidden(layer).float() for layer in head.hidden_state_layers]
        anchors, used = sample_anchors(valid_anchors(loss_mask, attention_mask), EVAL_ANCHORS, spread=True)
        tokens, teacher_positions, valid = depth_targets(head, input_ids, loss_mask, attention_mask, anchors, used)
        hidden = depth_hidden(head, head(input_ids, features, anchors, attention_mask))
        previous = previous_tokens(head, input_ids, anchors) if head.markov_head is not None else None
        logits = head.slot_logits(hidden, previous)
        greedy = view.greedy()  # [B, T], a chunk of positions at a time
        wanted = greedy[torch.arange(input_ids.shape[0], device=device)[:, None, None], teacher_positions.clamp_min(0)]
        on_path = torch.ones_like(valid)
        on_path[..., 1:] = (tokens[..., :-1] == wanted[..., :-1]).long().cumprod(dim=-1).bool()
        counted = valid & on_path
        top = logits.topk(ranks, dim=-1).indices
        hits = (top == wanted[..., None]) & counted[..., None]
        by_rank += hits.sum(dim=(0, 1)).float()
        agree += hits[..., 0].sum(dim=(0, 1))
        top5 += hits[..., :5].any(dim=-1).sum(dim=(0, 1))
        correct += ((top[..., 0] == tokens) & counted).sum(dim=(0, 1))
        counts += counted.sum(dim=(0, 1))
        run = hits[..., 0].long().cumprod(dim=-1).sum(dim=-1)  # [B, N] accepted drafts of a greedy chain
        accepted_total += float(run[used].sum())
        blocks += int(used.sum())
        for row, column in used.nonzero().tolist():
            if tree_blocks >= TREE_TAU_BLOCKS:
                break
            path = wanted[row, column][counted[row, column]].tolist()  # the base's greedy tokens, as far as known
            root = int(input_ids[row, anchors[row, column]])
            for budget in TREE_BUDGETS:
                tree_accepted[budget] += _tree_walk(head, hidden[row, column], root, budget, path)
            tree_blocks += 1
    if not counts.any():
        raise ValueError("no evaluation batches")
    summary = agreement_summary(agree, top5, correct, by_rank, counts)
    summary["chain_tau"] = 1.0 + accepted_total / max(blocks, 1)
    summary["tree_tau"] = {budget: 1.0 + value / max(tree_blocks, 1) for budget, value in tree_accepted.items()}
    return summary


def _tree_walk(head: DFlashHead, hidden: torch.Tensor, root: int, budget: int, path: list[int]) -> int:
    """How many of ``path``'s tokens a DDTree of ``budget`` nodes from this block's ``[D, h]`` slots accepts."""
    from specheads.methods.dflash.drafter import ddtree

    lm_head = head.lm_head()
    logits = lm_head(hidden.to(lm_head.weight.dtype)).float()  # [D, V] before any Markov bias
    k = min(budget, logits.shape[-1])
    marginal = None if head.markov_head is not None else logits.log_softmax(dim=-1).topk(k, dim=-1)

    def children(depth: int, token: int) -> tuple[list[float], list[int]]:
        if marginal is not None:
            return marginal.values[depth].tolist(), marginal.indices[depth].tolist()
        bias = head.markov_bias(torch.tensor([token], device=logits.device))[0].float()
        top = (logits[depth] + bias).log_softmax(dim=-1).topk(k)
        return top.values.tolist(), top.indices.tolist()

    parents, tokens = ddtree(root, head.config.num_drafts, budget, children) if path else ([], [])
    child = {(parent, token): node for node, (parent, token) in enumerate(zip(parents, tokens, strict=True), 1)}
    node, accepted = 0, 0
    for token in path:
        if (node, token) not in child:
            break
        node, accepted = child[(node, token)], accepted + 1
    return accepted
