"""What every method's held-out evaluation shares: agreement counts turned into rates, the tau they simulate, and
the base's own held-out loss.

Speculation pays only when a head proposes what the base would produce itself, so the number that predicts tau is
agreement with the base's greedy token, not accuracy against the data. Each method measures it in its own folder
(the function its registry entry names as ``evaluate``), reading the base through one
:class:`~specheads.training.features.BaseView` a batch.
"""

from __future__ import annotations

from typing import Any

import torch

from specheads.registry import Evaluation

RANKS = 10  # agreement is measured for the top-10 candidates of each head (tree calibration needs it per rank)


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
