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

from specheads.heads.eagle import EagleHead
from specheads.loading import vocab_size
from specheads.training.config import EagleHeadsConfig
from specheads.training.evaluate import RANKS, agreement_summary
from specheads.training.losses import draft_cross_entropy, eagle1_loss, eagle_targets, ttt_weights


def build_heads(base: torch.nn.Module, section: EagleHeadsConfig, dataset: Any) -> EagleHead:
    """A fresh fp32 EAGLE head; a reduced draft vocabulary takes the most frequent target tokens of ``dataset``."""
    counts = None
    vocab = vocab_size(base)
    if section.version == 3 and section.draft_vocab_size is not None and section.draft_vocab_size < vocab:
        counts = token_counts(dataset, vocab)
    return EagleHead.from_base(
        base,
        version=section.version,
        layer_ids=section.layer_ids,
        draft_vocab_size=section.draft_vocab_size,
        fc_bias=section.fc_bias,
        token_counts=counts,
        norm_before_residual=section.norm_before_residual,
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


def base_features(base: torch.nn.Module, head: EagleHead, batch: dict[str, torch.Tensor]) -> tuple[list, Any]:
    """One frozen base forward: the features the head reads and the base's output (logits for every position)."""
    with torch.no_grad():
        out = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    return [out.hidden_states[index].float() for index in head.hidden_state_layers], out


def train_step(run: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch (see the module docstring)."""
    section: EagleHeadsConfig = run.config.heads
    head: EagleHead = run.accelerator.unwrap_model(run.heads)
    input_ids, loss_mask = batch["input_ids"], batch["loss_mask"] * batch["attention_mask"]
    features, out = base_features(run.base, head, batch)
    corpus = section.targets == "corpus"
    base_logits = None if corpus else out.logits
    draft_ids = head.draft_token_ids() if head.config.reduced_vocab else None
    vocab = head.config.vocab_size
    if head.config.version == 1:
        hiddens, logits = run.heads(input_ids, features, batch["attention_mask"], 1, section.feature_noise)
        targets, mask = eagle_targets(base_logits, input_ids, loss_mask, 0, draft_ids, corpus, vocab)
        loss, parts = eagle1_loss(
            hiddens[0], logits[0], features[0], targets, mask, section.feature_loss_weight, section.ce_loss_weight
        )
        metrics = {name: float(value) for name, value in parts.items()}
        if run.logging_step:
            metrics["step_0/agreement"] = _agreement(head, logits[0], out.logits, 0, mask)
        return loss, metrics
    hiddens, logits = run.heads(input_ids, features, batch["attention_mask"], section.ttt_steps)
    weights = ttt_weights(section.ttt_steps, section.ttt_decay)
    loss = logits[0].sum() * 0.0
    metrics = {}
    for step, step_logits in enumerate(logits):
        targets, mask = eagle_targets(base_logits, input_ids, loss_mask, step, draft_ids, corpus, vocab)
        step_loss = draft_cross_entropy(step_logits, targets, mask)
        loss = loss + float(weights[step]) * step_loss
        metrics[f"step_{step}/loss"] = float(step_loss.detach())
        if run.logging_step:
            metrics[f"step_{step}/agreement"] = _agreement(head, step_logits, out.logits, step, mask)
    return loss, metrics


def _agreement(
    head: EagleHead, draft_logits: torch.Tensor, base_logits: torch.Tensor, step: int, mask: torch.Tensor
) -> float:
    """Teacher-forced agreement of step ``step``'s top-1 with the base's greedy token (a training-time signal)."""
    with torch.no_grad():
        count = draft_logits.shape[1] - step  # positions t with t + 1 + step <= T - 1
        drafted = head.to_target(draft_logits.argmax(dim=-1))[:, :count]
        wanted = base_logits[:, 1 + step : 1 + step + count].argmax(dim=-1)
        valid = mask[:, :count]
        return float(((drafted == wanted) & valid).sum() / valid.sum().clamp_min(1))


@torch.inference_mode()
def eagle_agreement(
    base: torch.nn.Module, head: EagleHead, batches: Any, max_batches: int | None = None, depth: int = 5
) -> dict[str, Any]:
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
    for index, batch in enumerate(batches):
        if max_batches is not None and index >= max_batches:
            break
        batch = {key: value.to(device) for key, value in batch.items() if isinstance(value, torch.Tensor)}
        input_ids = batch["input_ids"].long()
        valid_tokens = batch["loss_mask"].bool() & batch["attention_mask"].bool()
        features, out = base_features(base, head, batch)
        _, logits = head(input_ids, features, batch["attention_mask"], depth)
        greedy = out.logits.argmax(dim=-1)  # [B, T]: the base's token after position t
        length = input_ids.shape[1]
        on_path = torch.ones_like(input_ids[:, :-1], dtype=torch.bool)  # [B, T - 1]
        for step in range(depth):
            count = length - 2 - step  # positions t with a target t + 2 + step inside the sequence
            if count <= 0:
                break
            top = head.to_target(logits[step][:, :count].topk(ranks, dim=-1).indices)  # [B, count, R]
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
