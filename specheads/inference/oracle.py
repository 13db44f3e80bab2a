"""The exact output distribution of a base's sampling, for checking that speculative sampling is lossless.

:func:`two_token_distribution` enumerates ``P(t1, t2)`` of the base sampling two tokens after a prompt (every first
token, then the base's warped distribution after it), with transformers' own logits warpers; :func:`chi_square_p`
compares counts of decoded pairs with it, pooling the cells a chi-square test cannot use. The tests of every
sampling path and the claims benchmark read both from here.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specheads.inference.sampling import SamplingParams


@torch.no_grad()
def two_token_distribution(model: PreTrainedModel, prompt: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """``[V, V]``: the probability that the base samples ``t1`` then ``t2`` after ``prompt`` (``[1, T]``), with the
    temperature, top-k and top-p of ``sampling`` applied as transformers' ``generate(do_sample=True)`` applies them.
    """
    return token_distribution(model, prompt, sampling, 2)


def token_distribution(
    model: PreTrainedModel, prompt: torch.Tensor, sampling: SamplingParams, count: int = 3
) -> torch.Tensor:
    """``[V] * count``: the probability that the base samples ``t1, ..., t_count`` after ``prompt`` (``[1, T]``),
    with the temperature, top-k and top-p of ``sampling`` applied as transformers' ``generate(do_sample=True)``
    applies them (every prefix of the vocabulary enumerated: tiny vocabularies)."""
    warpers = [TemperatureLogitsWarper(sampling.temperature)]
    if sampling.top_k:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    prompt = prompt.to(model.device)
    joint = torch.ones(())
    prefixes = prompt
    for _ in range(count):
        scores = model(prefixes).logits[:, -1, :].float()
        for warper in warpers:
            scores = warper(prefixes, scores)
        probs = scores.softmax(dim=-1).cpu()  # [V ** depth, V]
        vocab = probs.shape[1]
        joint = (joint.reshape(-1, 1) * probs).reshape(*joint.shape, vocab)
        rows = prefixes.shape[0]
        prefixes = torch.cat(
            [prefixes.repeat_interleave(vocab, dim=0), torch.arange(vocab, device=prompt.device).repeat(rows)[:, None]],
            dim=1,
        )
    return joint


def sequence_counts(outputs: list[list[int]], vocab: int, count: int = 3) -> torch.Tensor:
    """``[V] * count`` counts of the first ``count`` tokens of each output."""
    counts = torch.zeros((vocab,) * count)
    for tokens in outputs:
        counts[tuple(tokens[:count])] += 1
    return counts


def chi_square_p(counts: torch.Tensor, probabilities: torch.Tensor, minimum: float = 5.0) -> float:
    """The chi-square p-value of ``counts`` against ``probabilities`` (same shape, any), with the cells whose
    expectation is below ``minimum`` pooled into one so that the approximation holds; impossible cells must be
    empty (a count there is p = 0)."""
    from scipy.stats import chisquare

    counts, probabilities = counts.flatten().double(), probabilities.flatten().double()
    if counts[probabilities <= 0].sum() > 0:
        return 0.0
    expected = probabilities / probabilities.sum() * counts.sum()
    small = expected < minimum
    observed = torch.cat([counts[~small], counts[small].sum(dim=0, keepdim=True)])
    expected = torch.cat([expected[~small], expected[small].sum(dim=0, keepdim=True)])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    if observed.numel() < 2:  # one possible outcome, and every count fell on it
        return 1.0
    return float(chisquare(observed.numpy(), (expected * observed.sum() / expected.sum()).numpy()).pvalue)


def pair_counts(pairs: list[list[int]], vocab: int) -> torch.Tensor:
    """``[V, V]`` counts of the first two tokens of each output."""
    counts = torch.zeros(vocab, vocab)
    for tokens in pairs:
        counts[tokens[0], tokens[1]] += 1
    return counts
