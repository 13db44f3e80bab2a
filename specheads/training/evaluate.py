"""Held-out evaluation of heads: how often each head agrees with the base's own greedy choice.

Speculation pays only when a head proposes what the base would produce itself, so the number that predicts tau is
agreement with the base's greedy token, not accuracy against the data. For head k at position t the base's own
choice is the argmax of its logits at position t + 1 + k (over the true prefix), the token at t + 2 + k.
"""

from __future__ import annotations

from typing import Any

import torch

from specheads.loading import vocab_size
from specheads.registry import Evaluation
from specheads.training.losses import projected_top_k

RANKS = 10  # agreement is measured for the top-10 candidates of each head (tree calibration needs it per rank)


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
        out = base(input_ids=input_ids, attention_mask=batch["attention_mask"], output_hidden_states=True)
        base_choice = out.logits.argmax(dim=-1)  # [B, T]: the base's token for position t + 1
        ranks = min(RANKS, vocab_size(base))
        # Each head's top-ranked ids, a chunk of positions at a time: no [K, B, T, V] logits.
        hidden = out.hidden_states[-1].to(next(heads.parameters()).dtype)
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


def agreement_summary(
    agree: torch.Tensor, top5: torch.Tensor, correct: torch.Tensor, by_rank: torch.Tensor, counts: torch.Tensor
) -> Evaluation:
    """Counts per depth (``[D]``, ``by_rank [D, R]``) turned into the rates every head type's evaluation reports."""
    agree, top5, correct, by_rank, counts = (t.float().cpu() for t in (agree, top5, correct, by_rank, counts))
    denominator = counts.clamp_min(1)
    return {
        "agreement_with_base_greedy": (agree / denominator).tolist(),
        "top5_agreement": (top5 / denominator).tolist(),
        "accuracy_vs_data": (correct / denominator).tolist(),
        "agreement_by_rank": (by_rank / denominator[:, None]).tolist(),
        "positions": [int(c) for c in counts],
    }


SIMULATED_TREES = (6, 16)  # tree sizes simulated next to chain-3: SmolLM2's calibrated bf16 tree has 6 nodes


def simulated_tau(
    agreement_by_rank: list[list[float]], chain: int = 3, trees: tuple[int, ...] = SIMULATED_TREES
) -> dict:
    """Expected tokens per decoding step (tau) from held-out per-depth, per-rank agreement, as tree calibration
    models it: a chain of ``chain`` top-1 drafts gives ``1 + a1 + a1 a2 + ...``; a tree of N nodes grown greedily
    (:func:`~specheads.inference.trees.grow_tree`) gives 1 plus the sum of its nodes' path probabilities.

    Agreement at depth d is measured where the path above it is the base's own (EAGLE) or per head (Medusa), so the
    products assume depths independent given the path; the engine's measured tau is the check.
    """
    from specheads.inference.trees import grow_tree

    result, reach = {}, 1.0
    tau = 1.0
    for depth in range(min(chain, len(agreement_by_rank))):
        reach *= float(agreement_by_rank[depth][0])
        tau += reach
    result[f"chain-{chain}"] = tau
    for nodes in trees:
        result[f"tree-{nodes}"] = 1.0 + sum(probability for _, probability in grow_tree(agreement_by_rank, nodes))
    return result


@torch.inference_mode()
def heldout_lm_loss(model: torch.nn.Module, batches: Any, max_batches: int | None = None) -> float:
    """Mean next-token cross-entropy (nats/token) of ``model`` over the counted tokens of ``batches``."""
    total, count = 0.0, 0
    for index, batch in enumerate(batches):
        if max_batches is not None and index >= max_batches:
            break
        input_ids = batch["input_ids"].long()
        logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"]).logits[:, :-1]
        mask = batch["loss_mask"][:, 1:].bool() & batch["attention_mask"][:, 1:].bool()
        losses = torch.nn.functional.cross_entropy(logits[mask].float(), input_ids[:, 1:][mask], reduction="sum")
        total += float(losses)
        count += int(mask.sum())
    return total / max(count, 1)
