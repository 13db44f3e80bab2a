"""EAGLE's part of the trainer: building heads, the loss of one micro-batch and the held-out evaluation.

The base stays frozen and in the loop: one forward per micro-batch gives the features the draft reads, the features
EAGLE-1 regresses onto and, by default, the targets (the base's own next-token distribution, self-distillation at no
extra cost; ``heads.targets=corpus`` trains on the data's tokens instead).

* EAGLE-1: ``feature_loss_weight * SmoothL1 + ce_loss_weight * CE`` on one draft step, uniform noise on the input
  features.
* EAGLE-3: "training-time test": the draft unrolled on its own outputs for ``ttt_steps`` steps,
  ``sum_i ttt_decay^i * CE_i``, no feature loss.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import PartialState

from specheads.methods.api import (
    RANKS,
    BaseView,
    Evaluation,
    StepContext,
    StepResult,
    agreement_summary,
    draft_vocab_coverage,
    draft_vocab_size_for_coverage,
    projected_top_k,
    select_draft_vocab,
    vocab_size,
)
from specheads.methods.eagle.config import EagleHeadsConfig
from specheads.methods.eagle.heads import EagleHead
from specheads.methods.eagle.losses import UnrolledLosses, eagle1_loss, eagle_loss, ttt_weights


def build_heads(base: torch.nn.Module, section: EagleHeadsConfig, dataset: Any) -> EagleHead:
    """A fresh fp32 EAGLE head; a reduced draft vocabulary takes the most frequent target tokens of ``dataset``
    (as many as ``heads.draft_vocab_size`` says, or as cover its ``coverage``; the choice is printed)."""
    counts = None
    vocab = vocab_size(base)
    size = section.draft_vocab_ids  # None for a coverage, which sets it from the counts
    if section.version == 3 and (section.draft_vocab_coverage is not None or (size is not None and size < vocab)):
        counts = token_counts(dataset, vocab)
        if section.draft_vocab_coverage is not None:
            size = draft_vocab_size_for_coverage(counts, section.draft_vocab_coverage)
        chosen = draft_vocab_coverage(counts, select_draft_vocab(counts, size))
        PartialState().print(
            f"draft vocabulary: {size:,} of {vocab:,} ids cover {chosen:.2%} of the {int(counts.sum()):,} training "
            "targets" + (f" (asked: {section.draft_vocab_coverage:.2%})" if section.draft_vocab_coverage else "")
        )
    return EagleHead.from_base(
        base,
        version=section.version,
        layer_ids=section.layer_ids,
        draft_vocab_size=size,
        fc_bias=section.fc_bias,
        token_counts=counts,
        norm_before_residual=section.norm_before_residual,
        fc_norm=section.fc_norm,
        norm_output=section.norm_output,
        norm_before_fc=section.norm_before_fc,
        intermediate_size=section.intermediate_size,
    ).float()


def token_counts(dataset: Any, vocab_size: int) -> torch.Tensor:
    """``[V]`` how often each token is a counted target (``loss_mask``) in ``dataset``."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for start in range(0, len(dataset), 256):
        rows = dataset[start : start + 256]
        ids = torch.as_tensor(rows["input_ids"]).long()
        mask = torch.as_tensor(rows["loss_mask"]).bool()
        counts += torch.bincount(ids[mask], minlength=vocab_size)
    return counts


def train_step(context: StepContext, batch: dict[str, torch.Tensor]) -> StepResult:
    """The loss of one micro-batch (see the module docstring).

    No draft step's logits are built whole: the head's forward hands each step's projection inputs to a readout
    that keeps them, and at the last step :func:`eagle_loss` scores them all, a chunk of positions at a time,
    against the base's logits (inside the forward, where wrappers such as DDP and FSDP see the projection's use).
    A logging step adds only the base's greedy tokens, a chunk of its logits at a time (:meth:`BaseView.greedy`).
    """
    section: EagleHeadsConfig = context.section
    head: EagleHead = context.module
    input_ids, loss_mask = batch["input_ids"], batch["loss_mask"] * batch["attention_mask"]
    corpus = section.targets == "corpus"
    draft_ids = head.draft_token_ids() if head.config.reduced_vocab else None
    # The teacher is the base's logits over the draft vocabulary alone, from its final hidden state; the logged
    # agreement metric reads the base's greedy tokens, never its whole [B, T, V] logits.
    features, view = context.base_features(batch, head.hidden_state_layers, full_logits=False)
    teacher = None if corpus else view.teacher(draft_ids)
    steps = 1 if head.config.version == 1 else section.ttt_steps
    step_weights = torch.ones(1) if head.config.version == 1 else ttt_weights(steps, section.ttt_decay)
    kept: list[torch.Tensor] = []

    def readout(step: int, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
        kept.append(inputs)
        if len(kept) < steps:
            return None
        targets = (teacher, input_ids, loss_mask, draft_ids, corpus, head.config.vocab_size)
        top_k = 1 if context.log_metrics else 0  # the agreement metric reads the draft's top-1
        return eagle_loss(kept, weight, bias, step_weights, *targets, top_k=top_k, tv_weight=section.tv_loss_weight)

    noise = section.feature_noise if head.config.version == 1 else 0.0
    hiddens, results = context.heads(input_ids, features, batch["attention_mask"], steps, noise, readout)
    losses: UnrolledLosses = results[-1]
    if head.config.version == 1:
        loss, parts = eagle1_loss(
            hiddens[0], features[0], losses.masks[0], losses.loss, section.feature_loss_weight, section.ce_loss_weight
        )
        metrics = {name: float(value) for name, value in parts.items()}
    else:
        loss = losses.loss
        metrics = {f"step_{step}/loss": float(value) for step, value in enumerate(losses.step_losses)}
    if context.log_metrics:
        greedy = view.greedy()  # [B, T]
        for step, (top, mask) in enumerate(zip(losses.tops, losses.masks, strict=True)):
            metrics[f"step_{step}/agreement"] = _agreement(head, top, greedy, step, mask)
    # each step's loss is a mean over its positions: the first step's count weighs it (later steps count a few fewer)
    return StepResult(loss, metrics, weight=int(losses.masks[0].sum()))


def _agreement(head: EagleHead, top: torch.Tensor, greedy: torch.Tensor, step: int, mask: torch.Tensor) -> float:
    """Teacher-forced agreement of step ``step``'s top-1 with the base's greedy token (a training-time signal).

    ``top`` ``[M, 1]`` holds the draft's top-1 (draft ids) at the M positions of ``mask`` ``[B, T - 1]``, in order;
    ``greedy`` ``[B, T]`` the base's greedy token after each position.
    """
    with torch.no_grad():
        batch_index, position = mask.nonzero(as_tuple=True)
        wanted = greedy[batch_index, position + 1 + step]  # the base's token at t + 2 + step
        drafted = head.to_target(top[:, 0])
        return float((drafted == wanted).sum() / max(int(mask.sum()), 1))


@torch.inference_mode()
def eagle_agreement(
    base: torch.nn.Module, head: EagleHead, batches: Any, max_batches: int | None = None, depth: int = 5
) -> Evaluation:
    """Per-depth agreement of the draft with the base's own greedy token on held-out data.

    Depth d + 1 is the draft unrolled d steps on its own outputs (:meth:`EagleHead.forward`) along the data. It is
    measured where the path above it is the base's own: the data's tokens at depths 1..d equal the base's greedy
    tokens there, which is what the draft sees when the base accepted them. Depth 1 has no condition, so its
    agreement is defined exactly as for Medusa head 0 (the base's greedy token at t + 2 against the draft's top-1 at
    t). ``agreement_by_rank[d][r]`` is how often the base's token is the draft's rank-r candidate, which tree
    calibration multiplies along paths.

    Returns:
        ``{"agreement_with_base_greedy": [D], "top5_agreement": [D], "accuracy_vs_data": [D],
        "agreement_by_rank": [D][RANKS], "positions": [D]}``.
    """
    ranks = min(RANKS, head.config.draft_vocab_size)
    device = base.get_output_embeddings().weight.device  # batches may come from a CPU loader
    by_rank = torch.zeros(depth, ranks, device=device)
    agree, top5, correct, counts = (torch.zeros(depth, device=device) for _ in range(4))

    def top_ids(step: int, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return projected_top_k(inputs, weight, bias, ranks)  # the draft's logits exist a chunk at a time

    for index, batch in enumerate(batches):
        if max_batches is not None and index >= max_batches:
            break
        batch = {key: value.to(device) for key, value in batch.items() if isinstance(value, torch.Tensor)}
        input_ids = batch["input_ids"].long()
        valid_tokens = batch["loss_mask"].bool() & batch["attention_mask"].bool()
        view = BaseView.of(base, batch, full_logits=False)
        features = [view.hidden(layer).float() for layer in head.hidden_state_layers]
        _, tops = head(input_ids, features, batch["attention_mask"], depth, readout=top_ids)  # [B, T - 1, R] each
        greedy = view.greedy()  # [B, T]: the base's token after position t, a chunk of positions at a time
        length = input_ids.shape[1]
        on_path = torch.ones_like(input_ids[:, :-1], dtype=torch.bool)  # [B, T - 1]
        for step in range(depth):
            count = length - 2 - step  # positions t with a target t + 2 + step inside the sequence
            if count <= 0:
                break
            top = head.to_target(tops[step][:, :count])  # [B, count, R]
            wanted = greedy[:, 1 + step : 1 + step + count]
            valid = on_path[:, :count] & valid_tokens[:, 2 + step :]
            hits = (top == wanted[..., None]) & valid[..., None]
            by_rank[step] += hits.sum(dim=(0, 1)).float()
            agree[step] += hits[..., 0].sum()
            top5[step] += hits[..., :5].any(dim=-1).sum()
            correct[step] += ((top[..., 0] == input_ids[:, 2 + step :]) & valid).sum()
            counts[step] += valid.sum()
            # the next depth is fed token t + 2 + step: on the base's path only if it is the base's own token
            on_path[:, :count] &= input_ids[:, 2 + step :] == wanted
    if not counts.any():
        raise ValueError("no evaluation batches")
    return agreement_summary(agree, top5, correct, by_rank, counts)
