"""The sampling distribution equals the one transformers' own logits warpers give."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specheads.inference.sampling import SamplingParams, probabilities, sample, warp_logits


def _transformers_warp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as ``generate(do_sample=True)`` orders them."""
    input_ids = torch.zeros(logits.shape[0], 1, dtype=torch.long)
    scores = TemperatureLogitsWarper(temperature)(input_ids, logits)
    if top_k:
        scores = TopKLogitsWarper(top_k)(input_ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(input_ids, scores)
    return scores


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [
        (1.0, 0, 1.0),
        (0.7, 0, 1.0),
        (1.3, 5, 1.0),
        (1.0, 0, 0.8),
        (0.5, 10, 0.9),
        (2.0, 3, 0.5),
        (1.0, 1, 1.0),
        (1.0, 0, 0.01),
        (0.8, 64, 0.95),  # top_k larger than the vocabulary
    ],
)
def test_matches_transformers_warpers(temperature: float, top_k: int, top_p: float) -> None:
    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(0)) * 3  # [B, V]
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)

    expected = _transformers_warp(logits, temperature, top_k, top_p)
    warped = warp_logits(logits, params)

    assert torch.equal(torch.isinf(warped), torch.isinf(expected))
    if top_k or top_p < 1.0:
        assert torch.isinf(expected).any()  # the case really filters something
    finite = torch.isfinite(expected)
    torch.testing.assert_close(warped[finite], expected[finite])
    torch.testing.assert_close(probabilities(logits, params), expected.softmax(dim=-1))


@pytest.mark.parametrize(
    ("logits", "top_k", "top_p", "kept"),
    [
        # Uniform over 4: the sorted cumulative mass is exactly [0.25, 0.5, 0.75, 1]; mass <= 1 - top_p is removed.
        pytest.param([0.0, 0.0, 0.0, 0.0], 0, 0.5, 2, id="top_p-boundary"),
        pytest.param([0.0, 0.0, 0.0, 0.0], 0, 0.75, 3, id="top_p-boundary-0.75"),
        # Ties with the k-th logit are kept, as in transformers.
        pytest.param([1.0, 1.0, 1.0, 0.0], 2, 1.0, 3, id="top_k-ties"),
    ],
)
def test_exact_boundaries_match_transformers(logits: list[float], top_k: int, top_p: float, kept: int) -> None:
    row = torch.tensor([logits])
    warped = warp_logits(row, SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p))
    expected = _transformers_warp(row, 1.0, top_k, top_p)
    assert int(torch.isfinite(expected).sum()) == kept
    assert int(torch.isfinite(warped).sum()) == kept


def test_warp_works_on_any_leading_shape() -> None:
    logits = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.9, top_k=4, top_p=0.9)
    flat = probabilities(logits.reshape(6, 16), params)
    torch.testing.assert_close(probabilities(logits, params), flat.reshape(2, 3, 16))


def test_temperature_zero_is_one_hot_at_the_argmax() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [5.0, 4.0, 3.0, 2.0], [-3.0, -2.0, -1.0, -2.5]])
    probs = probabilities(logits, SamplingParams(temperature=0.0))
    expected = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    assert torch.equal(probs, expected)
    assert torch.equal(warp_logits(logits, SamplingParams()), logits)


def test_sample_draws_from_the_support_with_the_right_shape() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 1.0]]).expand(3, 2, 4)
    drawn = sample(probs, torch.Generator().manual_seed(0))
    assert drawn.shape == (3, 2)
    assert drawn.dtype == torch.long
    assert set(drawn[:, 0].tolist()) <= {1, 2}
    assert drawn[:, 1].tolist() == [3, 3, 3]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
        ({"temperature": 1.0, "top_p": 1.5}, "top_p"),
        ({"temperature": 1.0, "top_p": math.nan}, "top_p"),
        ({"temperature": 1.0, "top_k": -1}, "top_k"),
        ({"temperature": 1.0, "top_k": 2.5}, "top_k"),
    ],
)
def test_sampling_params_reject_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_defaults_are_greedy() -> None:
    assert SamplingParams().greedy
    assert not SamplingParams(temperature=0.5).greedy
    assert SamplingParams(temperature=1.0, top_k=0, top_p=1.0).top_p == 1.0
