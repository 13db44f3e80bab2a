"""Acceptance rules on stub logits that force never / always / partial acceptance, and rejection's losslessness."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from specheads.inference.acceptance import (
    ACCEPTANCE_RULES,
    LOSSLESS_RULES,
    AcceptanceOptions,
    AcceptResult,
    rejection_chain,
    resolve_rule,
)
from specheads.inference.oracle import chi_square_p
from specheads.inference.sampling import SamplingParams, probabilities
from specheads.inference.trees import TreeBuffers, resolve_tree, tree_from_parents

VOCAB = 8
MARGIN = 20.0  # at temperature 1 a non-argmax token has probability ~ 7 * exp(-20) ~ 1e-8
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=1.0)

# Rules that, on logits with one dominant token per node, must behave like exact-match verification.
# (rule, sampling, draft distribution given)
ARGMAX_LIKE = [
    pytest.param("greedy", GREEDY, False, id="greedy"),
    pytest.param("rejection", GREEDY, False, id="rejection-T0"),
    pytest.param("rejection", GREEDY, True, id="rejection-T0-q"),
    pytest.param("rejection", SAMPLED, False, id="rejection-T1"),
    pytest.param("rejection", SAMPLED, True, id="rejection-T1-q"),
    pytest.param("typical", GREEDY, False, id="typical-T0"),
    pytest.param("typical", SAMPLED, False, id="typical-T1"),
    pytest.param("threshold", GREEDY, False, id="threshold-T0"),
    pytest.param("threshold", SAMPLED, False, id="threshold-T1"),
]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Thousands of tiny torch calls run far faster on one thread when the cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def peaked_logits(argmaxes: list[int], vocab: int = VOCAB) -> torch.Tensor:
    """Logits ``[len(argmaxes), vocab]`` whose row i puts a large margin on ``argmaxes[i]``."""
    logits = torch.zeros(len(argmaxes), vocab)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = MARGIN
    return logits


def draft_q(tokens: list[int], vocab: int = VOCAB) -> torch.Tensor:
    """A confident draft distribution ``[N, vocab]`` that proposed ``tokens[1:]``."""
    return peaked_logits(tokens[1:], vocab).softmax(dim=-1)


def log_probs(*rows: list[float]) -> torch.Tensor:
    """Logits whose softmax at temperature 1 gives the rows of probabilities (up to rounding)."""
    return torch.tensor(rows, dtype=torch.float32).log()


def accept(
    rule: str,
    p_logits: torch.Tensor,
    tokens: list[int],
    tree: TreeBuffers,
    sampling: SamplingParams,
    q: torch.Tensor | None = None,
    options: AcceptanceOptions | None = None,
    generator: torch.Generator | None = None,
) -> AcceptResult:
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    options = options if options is not None else AcceptanceOptions()
    result = ACCEPTANCE_RULES[rule](p_logits, torch.tensor(tokens), tree, q, sampling, generator, options)
    assert isinstance(result.next_token, int)
    return result


# ---------------------------------------------------------------------------------------------------------------
# never / always / partial on a chain of 3 drafts: tokens 3, 5, 7 after the root (token 0)

CHAIN_TOKENS = [0, 3, 5, 7]


@pytest.mark.parametrize(("rule", "sampling", "with_q"), ARGMAX_LIKE)
def test_never_accept(rule: str, sampling: SamplingParams, with_q: bool) -> None:
    # The root wants 4, not 3; deeper nodes would agree, but nothing below a rejection may be taken.
    p_logits = peaked_logits([4, 5, 7, 2])
    q = draft_q(CHAIN_TOKENS) if with_q else None
    result = accept(rule, p_logits, CHAIN_TOKENS, resolve_tree("chain-3"), sampling, q)
    assert result.path == []
    assert result.next_token == 4


@pytest.mark.parametrize(("rule", "sampling", "with_q"), ARGMAX_LIKE)
def test_always_accept_takes_the_bonus_token(rule: str, sampling: SamplingParams, with_q: bool) -> None:
    p_logits = peaked_logits([3, 5, 7, 2])
    q = draft_q(CHAIN_TOKENS) if with_q else None
    result = accept(rule, p_logits, CHAIN_TOKENS, resolve_tree("chain-3"), sampling, q)
    assert result.path == [1, 2, 3]
    assert result.next_token == 2


@pytest.mark.parametrize(("rule", "sampling", "with_q"), ARGMAX_LIKE)
def test_partial_accept_then_correction(rule: str, sampling: SamplingParams, with_q: bool) -> None:
    # Depth 1 (token 3) matches; at depth 2 the base wants 6, not 5; depth 3 would match again.
    p_logits = peaked_logits([3, 6, 7, 2])
    q = draft_q(CHAIN_TOKENS) if with_q else None
    result = accept(rule, p_logits, CHAIN_TOKENS, resolve_tree("chain-3"), sampling, q)
    assert result.path == [1]
    assert result.next_token == 6


# ---------------------------------------------------------------------------------------------------------------
# a branching tree: nodes 1 = [0], 2 = [1], 3 = [0, 0], 4 = [1, 0]

BRANCHING = [[0], [1], [0, 0], [1, 0]]
BRANCH_TOKENS = [0, 3, 5, 6, 7]


def test_branching_tree_layout() -> None:
    tree = resolve_tree(BRANCHING)
    assert tree.parents == (-1, 0, 0, 1, 2)
    assert tree.children == ((1, 2), (3,), (4,), (), ())


@pytest.mark.parametrize(("rule", "sampling", "with_q"), ARGMAX_LIKE)
def test_tree_second_child_and_its_subtree(rule: str, sampling: SamplingParams, with_q: bool) -> None:
    # The root wants 5 (node 2, the second child). Node 1 would lead to node 3 (its argmax 6 is node 3's token),
    # but node 1 is rejected, so only node 2's subtree may be followed: node 4 (token 7), then the bonus 2.
    p_logits = peaked_logits([5, 6, 7, 1, 2])
    q = draft_q(BRANCH_TOKENS) if with_q else None
    result = accept(rule, p_logits, BRANCH_TOKENS, resolve_tree(BRANCHING), sampling, q)
    assert result.path == [2, 4]
    assert result.next_token == 2


@pytest.mark.parametrize(("rule", "sampling", "with_q"), ARGMAX_LIKE)
def test_tree_second_child_then_rejection(rule: str, sampling: SamplingParams, with_q: bool) -> None:
    p_logits = peaked_logits([5, 6, 4, 1, 2])  # node 2 accepted, its child (token 7) rejected: the base says 4
    q = draft_q(BRANCH_TOKENS) if with_q else None
    result = accept(rule, p_logits, BRANCH_TOKENS, resolve_tree(BRANCHING), sampling, q)
    assert result.path == [2]
    assert result.next_token == 4


@pytest.mark.parametrize(
    ("rule", "sampling"),
    [
        (rule, sampling)
        for rule in sorted(ACCEPTANCE_RULES)
        for sampling in (GREEDY, SAMPLED)
        if sampling.greedy or rule != "greedy"
    ],  # greedy is only defined at temperature 0
)
def test_tree_without_drafts(rule: str, sampling: SamplingParams) -> None:
    result = accept(rule, peaked_logits([6]), [0], tree_from_parents([-1]), sampling)
    assert result.path == []
    assert result.next_token == 6


# ---------------------------------------------------------------------------------------------------------------
# typical: accept x if p(x) > min(epsilon, delta * exp(-H(p)))

TYPICAL_P = [0.5, 0.3, 0.15, 0.05]
# H = -(0.5 ln 0.5 + 0.3 ln 0.3 + 0.15 ln 0.15 + 0.05 ln 0.05) = 1.14212, exp(-H) = 0.31915
TYPICAL_EXP_NEG_H = 0.31915


@pytest.mark.parametrize(
    ("token", "epsilon", "delta", "accepted"),
    [
        pytest.param(2, 0.09, 0.3, True, id="defaults-0.15>min(0.09,0.0957)"),
        pytest.param(3, 0.09, 0.3, False, id="defaults-0.05<0.09"),
        pytest.param(2, 0.14, 1.0, True, id="epsilon-binds-0.15>0.14"),
        pytest.param(2, 0.16, 1.0, False, id="epsilon-binds-0.15<0.16"),
        pytest.param(2, 0.5, 0.45, True, id="delta-binds-0.15>0.1436"),
        pytest.param(2, 0.5, 0.5, False, id="delta-binds-0.15<0.1596"),
        pytest.param(2, 0.2, 0.3, True, id="min-not-max-0.15>min(0.2,0.0957)"),
    ],
)
def test_typical_criterion(token: int, epsilon: float, delta: float, accepted: bool) -> None:
    entropy = -sum(p * math.log(p) for p in TYPICAL_P)
    assert math.exp(-entropy) == pytest.approx(TYPICAL_EXP_NEG_H, abs=1e-5)
    assert (TYPICAL_P[token] > min(epsilon, delta * TYPICAL_EXP_NEG_H)) == accepted  # the hand computation

    p_logits = log_probs(TYPICAL_P, [0.01, 0.01, 0.97, 0.01])  # after the draft: only token 2 is typical
    options = AcceptanceOptions(posterior_threshold=epsilon, posterior_alpha=delta)
    result = accept("typical", p_logits, [0, token], resolve_tree("chain-1"), SAMPLED, options=options)
    if accepted:
        assert result.path == [1]
        assert result.next_token == 2
    else:
        assert result.path == []


def test_typical_next_token_is_restricted_to_typical_tokens() -> None:
    # Defaults: cutoff 0.09 at the root, so token 3 (p = 0.05) may never be sampled as the correction; 300 draws
    # from p unrestricted would contain it with probability 1 - 0.95^300.
    p_logits = log_probs(TYPICAL_P, [0.25, 0.25, 0.25, 0.25])
    generator = torch.Generator().manual_seed(0)
    drawn = set()
    for _ in range(300):
        result = accept("typical", p_logits, [0, 3], resolve_tree("chain-1"), SAMPLED, generator=generator)
        assert result.path == []
        drawn.add(result.next_token)
    assert drawn == {0, 1, 2}


# ---------------------------------------------------------------------------------------------------------------
# threshold: accept x if p(x) > acceptance_threshold


@pytest.mark.parametrize(
    ("sampling", "acceptance_threshold", "accepted"),
    [
        pytest.param(GREEDY, 0.25, True, id="T0-0.3>0.25"),
        pytest.param(GREEDY, 0.35, False, id="T0-0.3<0.35"),
        pytest.param(SAMPLED, 0.25, True, id="T1-0.3>0.25"),
        pytest.param(SAMPLED, 0.35, False, id="T1-0.3<0.35"),
        # top-k 2 renormalises p over {0, 1}: p(1) = 0.3 / 0.8 = 0.375
        pytest.param(SamplingParams(temperature=1.0, top_k=2), 0.35, True, id="topk2-0.375>0.35"),
        pytest.param(SamplingParams(temperature=1.0, top_k=2), 0.4, False, id="topk2-0.375<0.4"),
    ],
)
def test_threshold_criterion(sampling: SamplingParams, acceptance_threshold: float, accepted: bool) -> None:
    p_logits = log_probs([0.5, 0.3, 0.15, 0.05], [0.0001, 0.0001, 0.9997, 0.0001])
    options = AcceptanceOptions(acceptance_threshold=acceptance_threshold)
    # Token 1 is not the argmax (token 0 is): at temperature 0 the rule still uses the softmax, not a one-hot.
    result = accept("threshold", p_logits, [0, 1], resolve_tree("chain-1"), sampling, options=options)
    if accepted:
        assert result.path == [1]
        if sampling.greedy:
            assert result.next_token == 2
    else:
        assert result.path == []
        if sampling.greedy:
            assert result.next_token == 0


# ---------------------------------------------------------------------------------------------------------------
# alpha: accept x if q(x) >= alpha * p(x)


@pytest.mark.parametrize(
    ("token", "alpha", "accepted"),
    [
        pytest.param(0, 0.9, True, id="q0.5>=0.9*0.5"),
        pytest.param(0, 1.1, False, id="q0.5<1.1*0.5"),
        pytest.param(1, 0.6, True, id="q0.2>=0.6*0.3"),
        pytest.param(1, 0.9, False, id="q0.2<0.9*0.3"),
    ],
)
def test_alpha_criterion(token: int, alpha: float, accepted: bool) -> None:
    p_logits = log_probs([0.5, 0.3, 0.15, 0.05], [0.1, 0.1, 0.7, 0.1])
    q = torch.tensor([[0.5, 0.2, 0.2, 0.1]])
    options = AcceptanceOptions(alpha=alpha)
    result = accept("alpha", p_logits, [0, token], resolve_tree("chain-1"), GREEDY, q=q, options=options)
    assert result.path == ([1] if accepted else [])
    assert result.next_token == (2 if accepted else 0)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["T0", "T1"])
def test_alpha_without_draft_probabilities_is_refused(sampling: SamplingParams) -> None:
    # A deterministic drafter would count as q(x) = 1 >= alpha * p(x): every draft would pass, even where the base
    # disagrees with all of them. The rule is refused instead of emitting drafts unverified.
    p_logits = peaked_logits([4, 6, 1, 2])
    with pytest.raises(ValueError, match="no draft probabilities"):
        accept("alpha", p_logits, CHAIN_TOKENS, resolve_tree("chain-3"), sampling)


# ---------------------------------------------------------------------------------------------------------------
# rejection: the first emitted token is distributed as p (chi-square)

TRIALS = 8000
P_ROOT = [0.1, 0.2, 0.3, 0.4]
Q_DRAFT = torch.tensor([0.4, 0.3, 0.2, 0.1])


def _first_token(result: AcceptResult, tokens: list[int]) -> int:
    return tokens[result.path[0]] if result.path else result.next_token


def _assert_distributed_as(counts: torch.Tensor, target: torch.Tensor) -> None:
    assert counts[target <= 0].sum() == 0, f"tokens outside the target's support were emitted: {counts.tolist()}"
    p_value = chi_square_p(counts, target)
    assert p_value > 1e-3, f"counts {counts.tolist()} vs target {target.tolist()} (p {p_value:.2g})"


@pytest.mark.parametrize(
    "sampling",
    [SAMPLED, SamplingParams(temperature=0.7, top_k=3)],
    ids=["T1", "T0.7-topk3"],
)
@pytest.mark.parametrize("num_candidates", [1, 2])
def test_rejection_with_draft_distribution_is_lossless(sampling: SamplingParams, num_candidates: int) -> None:
    # Each trial draws the candidates i.i.d. from q (one child, or two siblings for the multi-candidate residual).
    tree = resolve_tree([[rank] for rank in range(num_candidates)])
    p_logits = log_probs(P_ROOT, *[[0.25] * 4] * num_candidates)  # [N + 1, V]
    q = Q_DRAFT.expand(num_candidates, 4)
    generator = torch.Generator().manual_seed(1234)
    counts = torch.zeros(4, dtype=torch.long)
    for _ in range(TRIALS):
        tokens = [0, *torch.multinomial(Q_DRAFT, num_candidates, replacement=True, generator=generator).tolist()]
        result = accept("rejection", p_logits, tokens, tree, sampling, q=q, generator=generator)
        counts[_first_token(result, tokens)] += 1
    _assert_distributed_as(counts, probabilities(p_logits[0], sampling))


def test_rejection_with_deterministic_candidates_is_lossless() -> None:
    tree = resolve_tree([[0], [1]])
    tokens = [0, 3, 1]  # the two most likely tokens, proposed deterministically (top-k heads)
    p_logits = log_probs(P_ROOT, [0.25] * 4, [0.25] * 4)
    generator = torch.Generator().manual_seed(4321)
    counts = torch.zeros(4, dtype=torch.long)
    for _ in range(TRIALS):
        result = accept("rejection", p_logits, tokens, tree, SAMPLED, generator=generator)
        counts[_first_token(result, tokens)] += 1
    _assert_distributed_as(counts, torch.tensor(P_ROOT))


@pytest.mark.parametrize("with_q", [True, False], ids=["q", "one-hot"])
def test_rejection_on_the_device_for_chains_is_lossless(with_q: bool) -> None:
    """The chain rule with one transfer: the first emitted token is distributed as p, and after an accepted first
    draft the second is distributed as p at node 1, whether the drafts come from q or are fixed."""
    tree = resolve_tree("chain-2")
    p_second = [0.5, 0.1, 0.1, 0.3]
    p_logits = log_probs(P_ROOT, p_second, [0.25] * 4)
    q = torch.stack([Q_DRAFT, torch.tensor([0.1, 0.6, 0.2, 0.1])]) if with_q else None
    generator = torch.Generator().manual_seed(99)
    first, second = torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)
    for _ in range(TRIALS):
        # With q: x1 ~ q0 and x2 ~ q1 (the draft at node 1); else fixed drafts.
        drafts = [int(torch.multinomial(q[j], 1, generator=generator)) for j in range(2)] if with_q else [3, 0]
        tokens = [0, *drafts]
        result = rejection_chain(p_logits, torch.tensor(tokens), tree, q, SAMPLED, generator, AcceptanceOptions())
        emitted = [tokens[node] for node in result.path] + [result.next_token]
        assert result.accepted == emitted[:-1]
        first[emitted[0]] += 1
        if result.path and tokens[1] == 3:  # the second token after an accepted first draft 3
            second[emitted[1]] += 1
    _assert_distributed_as(first, torch.tensor(P_ROOT))
    _assert_distributed_as(second, torch.tensor(p_second))


def test_chi_square_check_detects_a_lossy_rule() -> None:
    # The same check applied to the rule that accepts every draft sees q instead of p: the test above can fail.
    tree = resolve_tree("chain-1")
    p_logits = log_probs(P_ROOT, [0.25] * 4)
    generator = torch.Generator().manual_seed(1234)
    counts = torch.zeros(4, dtype=torch.long)
    for _ in range(2000):
        tokens = [0, int(torch.multinomial(Q_DRAFT, 1, generator=generator))]
        result = accept("alpha", p_logits, tokens, tree, SAMPLED, q=Q_DRAFT[None], generator=generator)
        counts[_first_token(result, tokens)] += 1
    with pytest.raises(AssertionError):
        _assert_distributed_as(counts, torch.tensor(P_ROOT))


# ---------------------------------------------------------------------------------------------------------------
# the decoder passes logits on the model's device and a generator made on that device


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize(
    ("rule", "sampling", "with_q"),
    [
        *ARGMAX_LIKE,
        pytest.param("alpha", GREEDY, True, id="alpha-T0-q"),
        pytest.param("alpha", SAMPLED, True, id="alpha-T1-q"),
    ],
)
def test_rules_run_on_the_model_device(rule: str, sampling: SamplingParams, with_q: bool) -> None:
    device = torch.device("cuda")
    p_logits = peaked_logits([3, 6, 7, 2]).to(device)
    q = draft_q(CHAIN_TOKENS).to(device) if with_q else None
    generator = torch.Generator(device=device).manual_seed(0)  # as SpecDecoder.generate makes it
    result = ACCEPTANCE_RULES[rule](
        p_logits,
        torch.tensor(CHAIN_TOKENS, device=device),
        resolve_tree("chain-3"),
        q,
        sampling,
        generator,
        AcceptanceOptions(),
    )
    # alpha passes every confident draft (q(x) ~ 1 >= 0.9 p(x)); the other rules stop where the base disagrees.
    assert (result.path, result.next_token) == (([1, 2, 3], 2) if rule == "alpha" else ([1], 6))


# ---------------------------------------------------------------------------------------------------------------
# registry and resolve_rule


@pytest.mark.parametrize("rule", sorted(ACCEPTANCE_RULES))
def test_the_lossless_rules_are_exactly_those_whose_output_follows_the_base(rule: str) -> None:
    """Every rule on one drafted token x ~ q: the first emitted token must follow the base (p at temperature 1, its
    argmax for greedy) for a rule in LOSSLESS_RULES, and must be caught off p for every other rule."""
    sampling = GREEDY if rule == "greedy" else SAMPLED
    tree = resolve_tree("chain-1")
    p_logits = log_probs(P_ROOT, [0.25] * 4)
    q = Q_DRAFT[None]
    generator = torch.Generator().manual_seed(2024)
    counts = torch.zeros(4, dtype=torch.long)
    for _ in range(TRIALS):
        tokens = [0, int(torch.multinomial(Q_DRAFT, 1, generator=generator))]
        result = accept(rule, p_logits, tokens, tree, sampling, q=q, generator=generator)
        counts[_first_token(result, tokens)] += 1
    p_value = chi_square_p(counts, probabilities(p_logits[0], sampling))
    if rule in LOSSLESS_RULES:
        assert p_value > 1e-3, f"{rule} is listed lossless but its output is off the base: {counts.tolist()}"
    else:
        assert p_value < 1e-3, f"{rule} is listed lossy but its output follows the base here: {counts.tolist()}"


def test_generation_defaults_are_the_rules_defaults() -> None:
    """GenerationConfig and AcceptanceOptions share one set of defaults (one is built from the other)."""
    from specheads.inference.generation import GenerationConfig

    config = GenerationConfig()
    assert config.options == AcceptanceOptions()
    assert config.rule == "greedy" and GenerationConfig(temperature=1.0).rule == "rejection"


@pytest.mark.parametrize(("sampling", "expected"), [(GREEDY, "greedy"), (SAMPLED, "rejection")])
def test_resolve_auto(sampling: SamplingParams, expected: str) -> None:
    assert resolve_rule("auto", sampling) == expected


@pytest.mark.parametrize("name", ["rejection", "typical", "threshold", "alpha"])
def test_resolve_named_rules(name: str) -> None:
    assert resolve_rule(name, GREEDY) == name
    assert resolve_rule(name, SAMPLED) == name
    assert resolve_rule("greedy", GREEDY) == "greedy"


def test_resolve_unknown_rule_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown acceptance rule 'medusa'") as error:
        resolve_rule("medusa", GREEDY)
    for choice in ("auto", "greedy", "rejection", "typical", "threshold", "alpha"):
        assert choice in str(error.value)


def test_resolve_greedy_with_temperature_raises() -> None:
    with pytest.raises(ValueError, match="temperature"):
        resolve_rule("greedy", SamplingParams(temperature=0.8))
