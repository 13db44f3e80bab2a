"""scripts/bench_claims.py: the exact two-token enumeration it reports TV distances with, checked against limiting
cases and against the engine itself (the tiny model pair only; the default-model benchmark is not run here)."""

from __future__ import annotations

import pytest
import torch
from helpers import load_script

from specheads import SpecDecoder
from specheads.inference.drafters import DraftModelDrafter

TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def claims():  # noqa: ANN201 - the script module
    return load_script("bench_claims")


@pytest.fixture(scope="module")
def pair(claims):  # noqa: ANN001, ANN201
    return claims.tiny_pair()


@pytest.fixture(scope="module")
def probs(claims, pair):  # noqa: ANN001, ANN201
    base, draft = pair
    prompt = [3, 5, 7]
    return claims.next_token_probs(base, prompt, TEMPERATURE), claims.next_token_probs(draft, prompt, TEMPERATURE)


def test_every_rule_gives_a_distribution_and_rejection_gives_the_base_one(claims, probs) -> None:
    p, q = probs
    reference = claims.base_two_tokens(p)
    for rule in claims.RULES:
        joint = claims.enumerate_two_tokens(rule, p, q)["joint"]
        assert float(joint.sum()) == pytest.approx(1.0, abs=1e-12)
        tv = claims.total_variation(joint, reference)
        if rule.lossless:
            assert tv < 1e-12
        else:
            assert tv > 0.01  # the lossy rules move this peaky pair's distribution


def test_limiting_cases_of_the_lossy_rules(claims, probs) -> None:
    p, q = probs
    accept_all = claims.RuleSetting("alpha 0", "alpha", {"alpha": 0.0})  # q(x) >= 0: every draft passes
    joint = claims.enumerate_two_tokens(accept_all, p, q)
    assert torch.allclose(joint["joint"], q[0][:, None] * q[1:], atol=1e-12)  # the draft's own distribution
    assert joint["expected_accepted"] == pytest.approx(2.0)
    reject_all = claims.RuleSetting("threshold 1", "threshold", {"acceptance_threshold": 1.0})  # p(x) > 1: never
    joint = claims.enumerate_two_tokens(reject_all, p, q)
    assert claims.total_variation(joint["joint"], claims.base_two_tokens(p)) < 1e-12  # the verifier's tokens
    assert joint["expected_accepted"] == 0.0


def test_the_enumeration_matches_the_engine(claims, pair, probs) -> None:
    """2,000 seeds through SpecDecoder.generate (batched) against the enumerated alpha-0.9 distribution."""
    base, draft = pair
    p, q = probs
    rule = next(r for r in claims.RULES if r.name == "alpha 0.9")
    decoder = SpecDecoder(base, DraftModelDrafter(draft, 2))
    counts = claims.monte_carlo(decoder, [3, 5, 7], rule, range(2000), 1000, TEMPERATURE)
    assert counts.sum() == 2000
    assert claims.chi_square_p(counts, claims.enumerate_two_tokens(rule, p, q)["joint"]) > 1e-3
    assert claims.batched_equals_alone(decoder, [3, 5, 7], TEMPERATURE, seeds=4)


def test_arguments_below_one_are_usage_errors(claims) -> None:
    with pytest.raises(SystemExit):
        claims.parse_args(["--limit", "0"])
