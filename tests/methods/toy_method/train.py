"""The toy method's part of the trainer: building heads, the loss of one micro-batch, held-out agreement."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from specheads.methods.api import RANKS, Evaluation, StepContext, StepResult, agreement_summary

from .config import ToyHeadsConfig
from .heads import ToyHeads


def build_heads(base: torch.nn.Module, section: ToyHeadsConfig, dataset: Any) -> ToyHeads:
    """Fresh fp32 toy heads for ``base``."""
    return ToyHeads.from_base(base, depth=section.depth).float()


def train_step(context: StepContext, batch: dict[str, torch.Tensor]) -> StepResult:
    """The sum over depths of the cross-entropy of depth d's logits at t against the data's token t + 1 + d."""
    head: ToyHeads = context.module
    (hidden,), out = context.base_features(batch, head.hidden_state_layers)
    input_ids = batch["input_ids"]
    counted = (batch["loss_mask"] * batch["attention_mask"]).bool()
    states = context.heads(hidden)  # [D, B, T, H]
    losses, metrics = [], {}
    for depth in range(1, states.shape[0] + 1):
        span = input_ids.shape[1] - 1 - depth
        if span <= 0:
            break
        logits = head.logits(states[depth - 1, :, :span]).float()  # [B, span, V]
        mask = counted[:, 1 + depth :]
        loss = F.cross_entropy(logits[mask], input_ids[:, 1 + depth :][mask]) if mask.any() else logits.sum() * 0
        losses.append(loss)
        metrics[f"depth_{depth}/loss"] = float(loss.detach())
        if context.log_metrics and mask.any():
            wanted = out.logits[:, depth : depth + span].argmax(dim=-1)  # the base's greedy token t + 1 + depth
            metrics[f"depth_{depth}/agreement"] = float((logits.argmax(dim=-1) == wanted)[mask].float().mean())
    return StepResult(torch.stack(losses).sum(), metrics)


@torch.inference_mode()
def evaluate(base: torch.nn.Module, heads: ToyHeads, batches: Any, max_batches: int | None = None) -> Evaluation:
    """Per-depth agreement of the chain with the base's greedy token along the data (teacher-forced).

    Returns:
        ``{"agreement_with_base_greedy": [D], "top5_agreement": [D], "accuracy_vs_data": [D],
        "agreement_by_rank": [D][RANKS], "positions": [D]}``.
    """
    depth = heads.config.depth
    ranks = min(RANKS, heads.config.vocab_size)
    device = base.get_output_embeddings().weight.device
    by_rank = torch.zeros(depth, ranks, device=device)
    agree, top5, correct, counts = (torch.zeros(depth, device=device) for _ in range(4))
    for index, batch in enumerate(batches):
        if max_batches is not None and index >= max_batches:
            break
        batch = {key: value.to(device) for key, value in batch.items() if isinstance(value, torch.Tensor)}
        input_ids = batch["input_ids"].long()
        counted = batch["loss_mask"].bool() & batch["attention_mask"].bool()
        out = base(input_ids=input_ids, attention_mask=batch["attention_mask"], output_hidden_states=True)
        states = heads(out.hidden_states[-1])
        greedy = out.logits.argmax(dim=-1)
        for step in range(1, depth + 1):
            span = input_ids.shape[1] - 1 - step
            if span <= 0:
                break
            top = heads.logits(states[step - 1, :, :span]).topk(ranks, dim=-1).indices  # [B, span, R]
            valid = counted[:, 1 + step :]
            hits = (top == greedy[:, step : step + span, None]) & valid[..., None]
            by_rank[step - 1] += hits.sum(dim=(0, 1)).float()
            agree[step - 1] += hits[..., 0].sum()
            top5[step - 1] += hits[..., :5].any(dim=-1).sum()
            correct[step - 1] += ((top[..., 0] == input_ids[:, 1 + step :]) & valid).sum()
            counts[step - 1] += valid.sum()
    return agreement_summary(agree, top5, correct, by_rank, counts)
