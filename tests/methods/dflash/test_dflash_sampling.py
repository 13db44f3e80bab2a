"""Block drafters keep sampling lossless: sampled chains verified with their distributions as q, and DDTree trees
verified as one-hot proposals, give the base's exact distribution of three tokens (chi-square against the enumerated
one; three, so that depth-2 drafts are verified too). The negative control verifies top-ranked tokens with the
marginals as q, which is biased, and is caught."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model, train_block_head

from specheads import SpecDecoder
from specheads.inference.oracle import chi_square_p, sequence_counts, token_distribution
from specheads.inference.sampling import SamplingParams, probabilities
from specheads.methods.dflash.drafter import DFlashDrafter

pytestmark = pytest.mark.slow  # Monte Carlo: thousands of seeded decodes per test

VOCAB = 12
PROMPT = torch.tensor([[3, 5, 7]])
SAMPLES = 4000
NEW_TOKENS = 3
SETTINGS = [
    pytest.param(dict(temperature=1.0, top_k=0, top_p=1.0), id="T1"),
    pytest.param(dict(temperature=0.6, top_k=6, top_p=1.0), id="T0.6-topk6"),
]


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=3, vocab_size=VOCAB, hidden=16, layers=2, logit_scale=30)


@pytest.fixture(scope="module")
def heads(base):
    prompts = torch.randint(2, VOCAB, (16, 3), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    with torch.no_grad():
        sequences = base.generate(prompts, do_sample=True, max_new_tokens=30, pad_token_id=0,
                                  attention_mask=torch.ones_like(prompts))  # fmt: skip
    common = {"layer_ids": [1], "num_layers": 1, "block_size": 3, "markov_rank": 4}
    return {variant: train_block_head(base, sequences, variant=variant, **common) for variant in ("dflash", "dspark")}


class _Counting(DFlashDrafter):
    accepted_drafts = 0

    def accepted(self, state, num_accepted) -> None:  # noqa: ANN001
        self.accepted_drafts += sum(num_accepted)
        super().accepted(state, num_accepted)


class _MarginalsAsQ(_Counting):
    """The biased rule the module docstring names: the top-1 chain verified with the marginals as q."""

    def _sampled_chains(self, state, block, request, length, limits):  # noqa: ANN001, ANN202
        proposals = super()._sampled_chains(state, block, request, length, limits)
        for proposal in proposals:
            if proposal is not None:
                proposal.tokens = proposal.draft_probs.argmax(dim=-1)
        return proposals


def _p_value(decoder: SpecDecoder, joint: torch.Tensor, **kwargs) -> float:
    outs = decoder.generate([PROMPT[0]] * SAMPLES, max_new_tokens=NEW_TOKENS, seed=list(range(SAMPLES)),
                            batch_size=500, acceptance="rejection", **kwargs)  # fmt: skip
    return chi_square_p(sequence_counts([out.new_tokens for out in outs], VOCAB, NEW_TOKENS), joint)


def _joint(base, sampling: dict) -> torch.Tensor:
    with torch.no_grad():
        return token_distribution(base, PROMPT, SamplingParams(**sampling), NEW_TOKENS)


@pytest.mark.parametrize("variant", ["dflash", "dspark"])
@pytest.mark.parametrize("sampling", SETTINGS)
@pytest.mark.parametrize("tree", ["chain-2", "ddtree-4"])
def test_sampled_chains_and_one_hot_ddtrees_sample_the_base_distribution(base, heads, variant, sampling, tree) -> None:
    drafter = _Counting(heads[variant], tree=tree)
    joint = _joint(base, sampling)
    assert _p_value(SpecDecoder(base, drafter), joint, **sampling) > 1e-3
    # drafts were both accepted and rejected
    assert 0.05 * SAMPLES < drafter.accepted_drafts < 0.99 * (NEW_TOKENS - 1) * SAMPLES


def test_top_ranked_drafts_verified_with_the_marginals_as_q_are_caught_negative_control(base, heads) -> None:
    drafter = _MarginalsAsQ(heads["dflash"], tree="chain-2")
    sampling = dict(temperature=1.0, top_k=0, top_p=1.0)
    joint = _joint(base, sampling)
    assert _p_value(SpecDecoder(base, drafter), joint, **sampling) < 1e-3


def test_the_draft_distributions_a_sampled_chain_reports_are_the_ones_it_drew_from(base, heads) -> None:
    """DSpark's q at depth 2 is the Markov-biased distribution given the token sampled at depth 1."""
    drafter = DFlashDrafter(heads["dspark"], tree="chain-2")
    seen = []
    original = drafter._sampled_chains

    def spy(state, block, request, length, limits):  # noqa: ANN001, ANN202
        proposals = original(state, block, request, length, limits)
        seen.append((block, request, proposals))
        return proposals

    drafter._sampled_chains = spy
    SpecDecoder(base, drafter).generate(PROMPT, max_new_tokens=6, temperature=1.0, seed=1, acceptance="rejection")
    block, request, proposals = seen[0]
    tokens, q = proposals[0].tokens[0], proposals[0].draft_probs[0]
    with torch.inference_mode():
        expected = probabilities(drafter._with_bias(block.logits[0, 1:2], tokens[:1]), request.sampling)[0]
    torch.testing.assert_close(q[1], expected)
