"""The distilled draft model's part of the trainer: building it from the base, the KL loss, held-out agreement."""

from __future__ import annotations

from typing import Any

import torch

from specheads.methods.api import (
    BaseView,
    Evaluation,
    StepContext,
    StepResult,
    linear_cross_entropy,
    projected_top_k,
)
from specheads.methods.draft_lm.config import DraftHeadsConfig
from specheads.methods.draft_lm.heads import DraftLM


def build_heads(base: torch.nn.Module, section: DraftHeadsConfig, dataset: Any) -> DraftLM:
    """A fresh fp32 draft with ``heads.num_layers`` of the base's layers (``heads.init_layers``)."""
    return DraftLM.from_base(base, num_layers=section.num_layers, init_layers=section.init_layers).float()


def _rows(loss_mask: torch.Tensor) -> torch.Tensor:
    """Flat indices of the positions t whose next token t + 1 is a target."""
    wanted = torch.zeros_like(loss_mask, dtype=torch.bool)
    wanted[:, :-1] = loss_mask[:, 1:].bool()
    return wanted.flatten().nonzero().squeeze(-1)


def train_step(context: StepContext, batch: dict[str, torch.Tensor]) -> StepResult:
    """``KL(base || draft)`` of the next-token distributions at every target position, a chunk of rows at a time:
    the base's logits too are projected a chunk at a time from its final hidden state
    (:meth:`BaseView.soft_teacher`), never built as ``[B, T, V]`` (a base with a logit transform aside)."""
    _, view = context.base_features(batch, (), full_logits=False)
    draft = context.module
    hidden = context.heads(batch["input_ids"], batch["attention_mask"]).float()  # [B, T, H]
    rows = _rows(batch["loss_mask"])
    teacher = view.soft_teacher(rows=rows)
    weight = draft.model.get_output_embeddings().weight
    scored = linear_cross_entropy(
        hidden.flatten(0, 1), weight.float(), teacher, rows=rows, kl=True, top_k=1 if context.log_metrics else 0
    )
    metrics = {"draft/kl": float(scored.loss.detach())}
    if scored.top is not None and rows.numel():
        metrics["draft/agreement"] = float((scored.top[:, 0] == teacher.greedy()).float().mean())
    return StepResult(scored.loss, metrics, weight=rows.numel())  # the mean KL over these rows


@torch.no_grad()
def draft_agreement(base: torch.nn.Module, heads: DraftLM, batches: Any, max_batches: int | None = None) -> Evaluation:
    """How often the draft's greedy token equals the base's at held-out target positions (depth 1: the draft reads
    the true prefix), as ``agreement_with_base_greedy`` ``[1]`` with ``positions``."""
    agree = count = 0
    for index, batch in enumerate(batches):
        if max_batches is not None and index >= max_batches:
            break
        device = base.get_output_embeddings().weight.device
        batch = {key: value.to(device) for key, value in batch.items() if isinstance(value, torch.Tensor)}
        input_ids = batch["input_ids"].long()
        rows = _rows(batch["loss_mask"])
        wanted = BaseView.of(base, batch, full_logits=False).greedy().flatten()[rows, None]  # [M, 1]
        lm_head = base.get_output_embeddings()
        hidden = heads(input_ids, batch["attention_mask"]).flatten(0, 1)[rows].to(lm_head.weight.dtype)
        weight = heads.model.get_output_embeddings().weight.to(lm_head.weight.dtype)
        drafted = projected_top_k(hidden, weight, None, 1)
        agree += int((drafted == wanted).sum())
        count += rows.numel()
    return {"agreement_with_base_greedy": [agree / count if count else 0.0], "positions": [count]}
