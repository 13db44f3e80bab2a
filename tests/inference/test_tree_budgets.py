"""Per-row budgets cutting a grown tree: in a batch, each row verifies only the nodes its own budget can use.

A row with ``r`` tokens left (``max_new_tokens`` or the model's position limit, whichever comes first) can take at
most ``r - 1`` drafted tokens plus the base's own, so its tree is cut to depth ``r - 1``: that row's only, while its
neighbours keep their deeper trees. The cut is tested by hand on a small tree (which nodes survive a depth of k), on
a proposal (its tokens, draft probabilities and device mask cut with the tree) and on a step's proposals (each row
its own limit), then end to end: ragged prompts near a tiny model's position limit decoded with EAGLE-2 dynamic trees
deeper than the shortest rows' budgets give each row's greedy output alone, and every verified tree is the drafted one
cut at its row's own budget.
"""

from __future__ import annotations

import pytest
import torch
from helpers import base_samples, greedy_reference, tiny_model, train_eagle_head

from specheads import SpecDecoder
from specheads.inference.packing import for_rows, truncated
from specheads.inference.state import Proposal
from specheads.inference.trees import tree_from_parents
from specheads.methods.eagle.drafter import EagleDrafter

# A hand-checked tree, nodes listed by depth as the drafters list them:
#   depth 1: 1, 2;  depth 2: 3, 4 (under 1), 5 (under 2);  depth 3: 6, 7 (under 3);  depth 4: 8 (under 6);
#   depth 5: 9 (under 8)
PARENTS = (-1, 0, 0, 1, 1, 2, 3, 3, 6, 8)
SURVIVORS = {  # depth limit -> the nodes kept (the root always)
    0: (0,),
    1: (0, 1, 2),
    2: (0, 1, 2, 3, 4, 5),
    3: (0, 1, 2, 3, 4, 5, 6, 7),
    4: (0, 1, 2, 3, 4, 5, 6, 7, 8),
    5: tuple(range(10)),
}
VOCAB = 96


def _proposal(rows: int = 1) -> Proposal:
    """A proposal on the hand-checked tree with distinct tokens (100 * row + node), draft probabilities and the
    per-row device mask and depths a dynamic tree carries."""
    tree = tree_from_parents(PARENTS)
    nodes = tree.num_nodes
    tokens = torch.tensor([[100 * row + node for node in range(1, nodes + 1)] for row in range(rows)])
    probs = torch.rand(rows, nodes, VOCAB, generator=torch.Generator().manual_seed(0))
    mask = tree.attention_mask[None].expand(rows, -1, -1).clone()
    depths = tree.depths[None].expand(rows, -1).clone()
    return Proposal(tokens, tree, probs, mask, depths)


@pytest.mark.parametrize("limit", sorted(SURVIVORS))
def test_a_tree_cut_to_depth_k_keeps_exactly_its_nodes_down_to_k_under_the_same_parents(limit: int) -> None:
    tree = tree_from_parents(PARENTS)
    kept = SURVIVORS[limit]
    cut = tree.truncated(limit)
    assert cut.parents == tuple(PARENTS[node] for node in kept)  # kept nodes keep their numbers and parents
    assert cut.max_depth == min(limit, 5)
    assert cut.choices == tree.choices[: len(kept) - 1]
    assert torch.equal(cut.attention_mask, tree.attention_mask[: len(kept), : len(kept)])
    assert torch.equal(cut.depths, tree.depths[: len(kept)])
    assert set(cut.paths[:, -1].tolist()) - {-1} <= set(kept)


@pytest.mark.parametrize("limit", sorted(SURVIVORS))
def test_a_proposal_cut_to_depth_k_keeps_the_tokens_probabilities_and_mask_of_those_nodes(limit: int) -> None:
    proposal = _proposal()
    kept = SURVIVORS[limit]
    cut = truncated(proposal, limit)
    if len(kept) == 1:
        assert cut is None  # nothing left to verify: the row decodes its root alone
        return
    if limit >= 5:
        assert cut is proposal
        return
    drafted = [node - 1 for node in kept[1:]]  # token columns of the kept nodes
    assert cut.tree.parents == tuple(PARENTS[node] for node in kept)
    assert cut.tokens.tolist() == [[node for node in kept[1:]]]
    assert torch.equal(cut.draft_probs, proposal.draft_probs[:, drafted])
    assert torch.equal(cut.attention_mask, proposal.attention_mask[:, kept][:, :, kept])
    assert cut.depths.tolist() == [[proposal.tree.levels[node] for node in kept]]


def test_each_row_of_a_step_is_cut_to_its_own_limit_only() -> None:
    proposal = _proposal(rows=3)
    limits = [5, 1, 3]
    cut = for_rows(proposal, limits, batch=3)
    assert isinstance(cut, list) and len(cut) == 3
    for row, (row_cut, limit) in enumerate(zip(cut, limits, strict=True)):
        kept = SURVIVORS[limit]
        assert row_cut.tree.parents == tuple(PARENTS[node] for node in kept), (row, limit)
        assert row_cut.tokens.tolist() == [[100 * row + node for node in kept[1:]]]
    assert for_rows(proposal, [5, 7, 6], batch=3) is proposal  # every row has room: one proposal for all
    per_row = [truncated(_proposal(), 5), None, truncated(_proposal(), 5)]
    cut = for_rows(per_row, [0, 4, 2], batch=3)
    assert cut[0] is None and cut[1] is None  # a limit of 0 verifies nothing; nothing drafted stays nothing
    assert cut[2].tree.parents == tuple(PARENTS[node] for node in SURVIVORS[2])


# ---------------------------------------------------------------------------------------------------- end to end
POSITIONS = 64  # the tiny base's position limit
PROMPT_LENGTHS = (3, 30, 50, 57)
MAX_NEW_TOKENS = 20  # rows 0 and 1 stop at max_new_tokens; rows 2 and 3 at the position limit (14 and 7 tokens)
TREE = {"tree": "dynamic", "tree_top_k": 2, "depth": 6, "total_tokens": 24}  # grows trees 6 deep


@pytest.fixture(scope="module")
def base_and_head():
    base = tiny_model("llama", seed=1, layers=4, logit_scale=4.0, max_positions=POSITIONS)
    sequences = base_samples(base, rows=16, new_tokens=40)
    counts = torch.bincount(sequences.flatten(), minlength=VOCAB)
    head = train_eagle_head(base, sequences, steps=60, version=3, draft_vocab_size=64, token_counts=counts)
    return base, head


def _row_proposals(proposal, batch: int) -> list[Proposal | None]:
    """A drafter's or a step's answer as one proposal (or None) per row."""
    if proposal is None or isinstance(proposal, list):
        return proposal or [None] * batch
    return [Proposal(proposal.tokens[i : i + 1], proposal.tree) for i in range(batch)]


def test_rows_with_different_budgets_cut_their_own_trees_and_decode_as_greedy_alone(base_and_head) -> None:
    base, head = base_and_head
    prompts = base_samples(base, rows=len(PROMPT_LENGTHS), new_tokens=max(PROMPT_LENGTHS) - 4, seed=7)
    prompts = [prompts[row, :length].tolist() for row, length in enumerate(PROMPT_LENGTHS)]
    budgets = [min(MAX_NEW_TOKENS, POSITIONS - length) for length in PROMPT_LENGTHS]
    decoder = SpecDecoder(base, EagleDrafter(head))
    drafted: list[list[Proposal | None]] = []
    verified: list[tuple[list[int], list[int], list[Proposal | None]]] = []  # rows, their limits, their trees
    propose, step = decoder.drafter.propose, decoder._step

    def watched_propose(state, request):
        proposal = propose(state, request)
        drafted.append(_row_proposals(proposal, state.batch_size))
        return proposal

    def watched_step(state, proposals, settings, max_length):
        # a row with r tokens left (its own max_new_tokens or position budget) verifies at most r - 1 drafted ones
        left = [
            min(MAX_NEW_TOKENS - (state.lengths[row] - state.prompt_lengths[row]), POSITIONS - state.lengths[row])
            for row in state.rows
        ]
        limits = [remaining - 1 for remaining in left]
        verified.append((list(state.rows), limits, _row_proposals(proposals, state.batch_size)))
        return step(state, proposals, settings, max_length)

    decoder.drafter.propose, decoder._step = watched_propose, watched_step
    outs = decoder.generate(prompts, max_new_tokens=MAX_NEW_TOKENS, **TREE)

    for row, (prompt, out, budget) in enumerate(zip(prompts, outs, budgets, strict=True)):
        assert torch.equal(out.sequences, greedy_reference(base, torch.tensor([prompt]), budget)), row
        assert len(out.new_tokens) == budget
        assert out.finish_reason == ("max_new_tokens" if budget == MAX_NEW_TOKENS else "max_length")

    assert len(drafted) == len(verified)
    cut_beside_deeper = 0
    for (rows, limits, trees), proposals in zip(verified, drafted, strict=True):
        for limit, tree, proposal in zip(limits, trees, proposals, strict=True):
            if proposal is None:
                assert tree is None
                continue
            kept = sum(1 for depth in proposal.tree.levels[1:] if depth <= limit)  # nodes come by depth
            if kept == 0:
                assert tree is None
                continue
            assert tree.tree.parents == proposal.tree.parents[: kept + 1]
            assert torch.equal(tree.tokens, proposal.tokens[:, :kept])
        depths = [0 if tree is None else tree.tree.max_depth for tree in trees]
        drafted_depths = [0 if p is None else p.tree.max_depth for p in proposals]
        cut_beside_deeper += any(
            drafted_depths[i] > limits[i] and depths[j] > limits[i] for i in range(len(rows)) for j in range(len(rows))
        )
    assert cut_beside_deeper, "no step cut one row's tree while a neighbour kept deeper nodes: make the budgets tighter"
