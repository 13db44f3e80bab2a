"""Medusa's held-out evaluation: how often each head agrees with the base's own greedy choice.

Speculation pays only when a head proposes what the base would produce itself, so the number that predicts tau is
agreement with the base's greedy token, not accuracy against the data. For head k at position t the base's own
choice is its greedy token after position t + 1 + k (over the true prefix), the token at t + 2 + k.
"""

from __future__ import annotations

from typing import Any

import torch

from specheads.methods.api import RANKS, BaseView, Evaluation, agreement_summary, projected_top_k, vocab_size


@torch.inference_mode()
def head_agreement(
    base: torch.nn.Module, heads: torch.nn.Module, batches: Any, max_batches: int | None = None
) -> Evaluation:
    """Per-head top-1 agreement with the base's greedy token and top-1 accuracy against the data.

    Args:
        base: the base model (eval mode).
        heads: Medusa heads producing ``[K, B, T, V]`` from the base's last hidden states.
        batches: an iterable of dicts with ``input_ids``, ``attention_mask`` and ``loss_mask`` ``[B, T]``.
        max_batches: stop after this many batches.

    Returns:
        ``{"agreement_with_base_greedy": [K], "top5_agreement": [K], "accuracy_vs_data": [K],
        "agreement_by_rank": [K][RANKS] (how often the base's token is the head's rank-r candidate),
        "positions": [K]}``.
    """
    agree = top5 = correct = counts = by_rank = None
    for index, batch in enumerate(batches):
        if max_batches is not None and index >= max_batches:
            break
        device = base.get_output_embeddings().weight.device  # batches may come from a CPU loader
        batch = {key: value.to(device) for key, value in batch.items() if isinstance(value, torch.Tensor)}
        input_ids = batch["input_ids"].long()
        view = BaseView.of(base, batch, full_logits=False)
        base_choice = view.greedy()  # [B, T]: the base's token for position t + 1, a chunk of positions at a time
        ranks = min(RANKS, vocab_size(base))
        # Each head's top-ranked ids, a chunk of positions at a time: no [K, B, T, V] logits.
        hidden = view.final.to(next(heads.parameters()).dtype)
        tops = heads(hidden, readout=lambda _, states, weight, bias, k=ranks: projected_top_k(states, weight, bias, k))
        num_heads, length = len(tops), input_ids.shape[1]
        if agree is None:
            agree, top5, correct, counts = (torch.zeros(num_heads, device=device) for _ in range(4))
            by_rank = torch.zeros(num_heads, ranks, device=device)
        for head in range(num_heads):
            shift = head + 2  # head k at position t predicts token t + 2 + k
            span = length - shift
            if span <= 0:
                continue
            valid = batch["loss_mask"][:, shift:].bool() & batch["attention_mask"][:, shift:].bool()  # [B, span]
            top = tops[head][:, :span]  # [B, span, R]
            wanted = base_choice[:, shift - 1 : length - 1]  # the base's own token at t + 2 + k
            agree[head] += ((top[..., 0] == wanted) & valid).sum()
            hits = (top == wanted[..., None]) & valid[..., None]  # [B, span, R]
            top5[head] += hits[..., :5].any(dim=-1).sum()
            by_rank[head] += hits.sum(dim=(0, 1))
            correct[head] += ((top[..., 0] == input_ids[:, shift:]) & valid).sum()
            counts[head] += valid.sum()
    if counts is None:
        raise ValueError("no evaluation batches")
    return agreement_summary(agree, top5, correct, by_rank, counts)
