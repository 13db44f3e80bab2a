"""Prompt lookup proposes what transformers' prompt lookup proposes, as the context grows step by step."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from specheads.inference.drafters import PromptLookupDrafter
from specheads.inference.sampling import SamplingParams
from specheads.inference.state import DecodeState, DraftRequest


def transformers_lookup(context: list[int], num_tokens: int, max_ngram_size: int) -> list[int]:
    """The tokens transformers' ``PromptLookupCandidateGenerator`` proposes after ``context`` (none: ``[]``)."""
    generator = PromptLookupCandidateGenerator(
        num_output_tokens=num_tokens, max_matching_ngram_size=max_ngram_size, max_length=len(context) + num_tokens + 2
    )
    candidates, _ = generator.get_candidates(torch.tensor([context]))
    return candidates[0, len(context) :].tolist()


@pytest.mark.parametrize("max_ngram_size", [1, 2, 3])
@pytest.mark.parametrize("num_tokens", [1, 4])
def test_proposals_equal_transformers_prompt_lookup_at_every_step(max_ngram_size: int, num_tokens: int) -> None:
    """The drafter indexes n-grams as tokens are committed; at every step its proposal is the continuation of the
    earliest earlier occurrence of the longest suffix n-gram that has one, as transformers' generator finds it by
    scanning the whole context."""
    generator = torch.Generator().manual_seed(1000 * max_ngram_size + num_tokens)
    drafter = PromptLookupDrafter(num_tokens, max_ngram_size)
    request = DraftRequest(sampling=SamplingParams(), max_depth=64)
    matched = 0
    for trial in range(4):
        vocab = 3 + trial  # a small vocabulary: n-grams repeat, with several continuations each
        stream = torch.randint(vocab, (80,), generator=generator).tolist()
        prompt = stream[:5]
        tokens = torch.zeros(1, len(stream), dtype=torch.long)
        tokens[0, : len(prompt)] = torch.tensor(prompt)
        state = DecodeState(tokens, [len(prompt)], [len(prompt)], cache=None)
        state.host_tokens = [list(prompt)]
        drafter.reset(state)
        committed = len(prompt)
        while committed < len(stream):
            context = state.host_tokens[0]
            (proposal,) = drafter.propose(state, request)
            proposed = [] if proposal is None else proposal.tokens[0].tolist()
            assert proposed == transformers_lookup(context, num_tokens, max_ngram_size), context
            matched += bool(proposed)
            step = 1 + committed % 3  # commit 1 to 3 tokens per step, as verification does
            state.append_rows({0: stream[committed : committed + step]})
            committed += step
    assert matched > 20  # the contexts repeat: most steps found a match
