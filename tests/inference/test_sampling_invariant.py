"""The sampling invariant: with rejection sampling, speculative output is distributed exactly like the base's own.

The joint distribution of the first three new tokens is computed exactly by enumeration over a tiny vocabulary (with
transformers' own logits warpers), and compared with generated samples by a chi-square test: three tokens, so that
drafts at depth 2 are verified too (what a drafter reports for them, and the bonus token after them). The models'
logits are sharpened so that a sampler that is off (accepting too often, a wrong residual) is caught; a lossy rule
run through the same harness is the negative control that shows the test has the power to fail.
"""

from __future__ import annotations

import pytest
import torch
from helpers import RandomTreeDrafter, tiny_model

from specheads import SpecDecoder
from specheads.heads import EagleHead
from specheads.inference.drafters import DraftModelDrafter
from specheads.inference.oracle import chi_square_p, sequence_counts, token_distribution
from specheads.inference.sampling import SamplingParams
from specheads.inference.trees import resolve_tree
from specheads.methods.eagle.drafter import EagleDrafter
from specheads.methods.eagle.losses import draft_cross_entropy, eagle_targets

pytestmark = pytest.mark.slow  # Monte Carlo: thousands of seeded decodes per test

VOCAB = 12
PROMPT = torch.tensor([[3, 5, 7]])
SAMPLES = 4000
NEW_TOKENS = 3


def _base_distribution(model, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Exact ``P(t1, t2, t3)`` ``[V, V, V]`` of the base sampling three tokens after PROMPT."""
    with torch.no_grad():
        return token_distribution(model, PROMPT, SamplingParams(temperature, top_k, top_p), NEW_TOKENS)


def _p_value(decoder: SpecDecoder, joint: torch.Tensor, **kwargs) -> float:
    """SAMPLES decodes of three tokens, seeds 0..SAMPLES-1, as batched rows (a row draws what it draws alone)."""
    outs = decoder.generate(
        [PROMPT[0]] * SAMPLES, max_new_tokens=NEW_TOKENS, seed=list(range(SAMPLES)), batch_size=500, **kwargs
    )
    return chi_square_p(sequence_counts([out.new_tokens for out in outs], VOCAB, NEW_TOKENS), joint)


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=3, vocab_size=VOCAB, hidden=16, layers=1, logit_scale=30)


@pytest.fixture(scope="module")
def draft():
    return tiny_model("llama", seed=4, vocab_size=VOCAB, hidden=16, layers=1, logit_scale=15)


SETTINGS = [
    pytest.param(dict(temperature=1.0, top_k=0, top_p=1.0), id="T1"),
    pytest.param(dict(temperature=0.6, top_k=6, top_p=1.0), id="T0.6-topk6"),
    pytest.param(dict(temperature=0.8, top_k=0, top_p=0.9), id="T0.8-topp0.9"),
]


@pytest.mark.parametrize("sampling", SETTINGS)
def test_chain_from_a_draft_model_samples_the_base_distribution(base, draft, sampling) -> None:
    decoder = SpecDecoder(base, DraftModelDrafter(draft, 2))
    joint = _base_distribution(base, **sampling)
    assert _p_value(decoder, joint, acceptance="rejection", **sampling) > 1e-3


@pytest.mark.parametrize("sampling", SETTINGS[:2])
def test_tree_of_deterministic_candidates_samples_the_base_distribution(base, sampling) -> None:
    tree = resolve_tree([[0], [1], [2], [0, 0], [0, 1], [1, 0]])
    decoder = SpecDecoder(base, RandomTreeDrafter(tree, VOCAB, seed=5))
    joint = _base_distribution(base, **sampling)
    assert _p_value(decoder, joint, acceptance="rejection", **sampling) > 1e-3


class _TopCandidatesTreeDrafter(RandomTreeDrafter):
    """A static tree whose candidates are the base's own top-ranked tokens after each node's path, proposed with
    q = None: a rejected sibling carries real probability mass, so a residual that is not renormalised (or not
    cleared of a rejected candidate) shows in the samples."""

    name = "top-candidates-tree"

    def __init__(self, base, tree) -> None:  # noqa: ANN001
        super().__init__(tree, VOCAB)
        self.base = base
        self.ranked: dict[tuple[int, ...], list[int]] = {}

    def _ranked(self, tokens: tuple[int, ...]) -> list[int]:
        if tokens not in self.ranked:
            with torch.no_grad():
                logits = self.base(torch.tensor([tokens])).logits[0, -1]
            self.ranked[tokens] = logits.argsort(descending=True).tolist()
        return self.ranked[tokens]

    def propose(self, state, request):  # noqa: ANN001, ANN201
        from specheads.inference.state import Proposal

        tree = self.tree.truncated(request.max_depth)
        if tree.num_nodes == 0:
            return None
        rows = []
        for row in state.rows:
            committed = tuple(state.sequence(row).tolist())
            paths: dict[int, tuple[int, ...]] = {0: ()}
            tokens = [0] * tree.num_nodes
            for node in range(tree.num_nodes + 1):
                for rank, child in enumerate(tree.children[node]):
                    token = self._ranked(committed + paths[node])[rank]
                    tokens[child - 1] = token
                    paths[child] = paths[node] + (token,)
            rows.append(tokens)
        return Proposal(tokens=torch.tensor(rows), tree=tree, draft_probs=None)


@pytest.mark.parametrize("sampling", SETTINGS[:2])
def test_a_static_tree_of_the_bases_top_candidates_samples_the_base_distribution(base, sampling) -> None:
    tree = resolve_tree([[0], [1], [2], [0, 0], [0, 1], [1, 0]])
    decoder = SpecDecoder(base, _TopCandidatesTreeDrafter(base, tree))
    joint = _base_distribution(base, **sampling)
    assert _p_value(decoder, joint, acceptance="rejection", **sampling) > 1e-3


def test_plain_sampling_through_the_engine_samples_the_base_distribution(base) -> None:
    joint = _base_distribution(base, temperature=1.0, top_k=0, top_p=1.0)
    assert _p_value(SpecDecoder(base), joint, temperature=1.0) > 1e-3


def test_a_lossy_rule_is_caught_negative_control(base) -> None:
    """'typical' accepts random drafts the base finds plausible without the residual correction: the harness must
    reject it."""
    tree = resolve_tree([[0], [1], [0, 0]])
    decoder = SpecDecoder(base, RandomTreeDrafter(tree, VOCAB, seed=6))
    joint = _base_distribution(base, temperature=1.0, top_k=0, top_p=1.0)
    assert _p_value(decoder, joint, acceptance="typical", temperature=1.0) < 1e-3


def test_seed_makes_sampling_reproducible(base, draft) -> None:
    decoder = SpecDecoder(base, DraftModelDrafter(draft, 3))
    first = decoder.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=123).new_tokens
    again = decoder.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=123).new_tokens
    assert first == again
    others = {tuple(decoder.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=s).new_tokens) for s in range(5)}
    assert len(others) > 1


def test_medusa_tree_samples_the_base_distribution(base) -> None:
    from specheads.heads import MedusaHeads
    from specheads.methods.medusa.drafter import MedusaDrafter

    heads = MedusaHeads.from_base(base, num_heads=2)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(7)))
    decoder = SpecDecoder(base, MedusaDrafter(heads, tree=[[0], [1], [0, 0], [1, 0]]))
    joint = _base_distribution(base, temperature=1.0, top_k=0, top_p=1.0)
    assert _p_value(decoder, joint, acceptance="rejection", temperature=1.0) > 1e-3


class _CountingEagleDrafter(EagleDrafter):
    """An EagleDrafter that counts the drafted tokens the base accepted (so the test knows drafts were tried)."""

    accepted_drafts = 0

    def accepted(self, state, num_accepted) -> None:
        self.accepted_drafts += sum(num_accepted)  # every row of the batch
        super().accepted(state, num_accepted)


@pytest.fixture(scope="module")
def eagle_head(base):
    """An EAGLE-3 head (draft vocabulary: the base's 8 most frequent tokens) trained briefly on the base's samples,
    so that its top-k candidates are plausible and get both accepted and rejected."""
    prompts = torch.randint(2, VOCAB, (16, 3), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    with torch.no_grad():
        sequences = base.generate(
            prompts, do_sample=True, max_new_tokens=30, pad_token_id=0, attention_mask=torch.ones_like(prompts)
        )
        out = base(sequences, output_hidden_states=True)
    counts = torch.bincount(sequences.flatten(), minlength=VOCAB)
    head = EagleHead.from_base(base, version=3, draft_vocab_size=8, token_counts=counts)
    features = [out.hidden_states[index] for index in head.hidden_state_layers]
    loss_mask = torch.ones_like(sequences)
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(60):
        _, logits = head(sequences, features, None, steps=2)
        loss = sum(
            draft_cross_entropy(
                step_logits, *eagle_targets(out.logits, sequences, loss_mask, step, head.draft_token_ids())
            )
            for step, step_logits in enumerate(logits)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


@pytest.mark.parametrize("sampling", SETTINGS[:2])
def test_eagle_dynamic_tree_samples_the_base_distribution(base, eagle_head, sampling) -> None:
    """Rejection over an EAGLE-2 tree: three sibling candidates at depth 1, their children at depth 2."""
    drafter = _CountingEagleDrafter(eagle_head)
    decoder = SpecDecoder(base, drafter)
    joint = _base_distribution(base, **sampling)
    dynamic = dict(tree="dynamic", tree_top_k=3, depth=3, total_tokens=6)
    assert _p_value(decoder, joint, acceptance="rejection", **dynamic, **sampling) > 1e-3
    # drafts were both accepted and rejected, and depth-2 drafts were accepted too (more than one a sample)
    assert SAMPLES < drafter.accepted_drafts < 0.99 * (NEW_TOKENS - 1) * SAMPLES
