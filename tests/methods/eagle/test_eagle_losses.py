"""EAGLE loss alignment, checked by hand: the draft at position t reads token t + 1 and the feature of t; unrolled
step i predicts token t + 2 + i, whose base distribution is the base's logits at t + 1 + i. The unrolled training
forward ("training-time test") must equal what the drafter computes at decode time, one token at a time.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_model

from specheads.heads import EagleHead
from specheads.heads.vocab import select_draft_vocab
from specheads.inference import kv_cache
from specheads.methods.eagle.losses import draft_cross_entropy, eagle1_loss, eagle_loss, eagle_targets, ttt_weights

VOCAB = 8
TOKENS = torch.tensor([[2, 3, 4, 5, 6, 7]])  # [1, 6]
ALL = torch.ones_like(TOKENS)


def _base_logits() -> torch.Tensor:
    """``[1, 6, V]`` a different, known distribution at every position: position p puts most mass on token p."""
    logits = torch.zeros(1, 6, VOCAB)
    for position in range(6):
        logits[0, position, position] = 3.0
        logits[0, position, (position + 3) % VOCAB] = 1.0 + 0.1 * position
    return logits


# ---------------------------------------------------------------------------------------------------- targets
@pytest.mark.parametrize("step", [0, 1, 3])
def test_distillation_targets_are_the_base_at_t_plus_1_plus_step(step: int) -> None:
    logits = _base_logits()
    targets, mask = eagle_targets(logits, TOKENS, ALL, step)
    assert targets.shape == (1, 5, VOCAB) and mask.shape == (1, 5)
    count = 6 - 2 - step  # positions t with t + 2 + step <= 5
    assert mask[0].tolist() == [True] * count + [False] * (5 - count)
    for t in range(count):
        torch.testing.assert_close(targets[0, t], logits[0, t + 1 + step].softmax(dim=-1))
    assert targets[0, count:].abs().sum() == 0  # past the sequence: nothing


@pytest.mark.parametrize("step", [0, 2])
def test_corpus_targets_are_the_token_at_t_plus_2_plus_step(step: int) -> None:
    targets, mask = eagle_targets(None, TOKENS, ALL, step, corpus=True)
    count = 4 - step
    assert targets[0, :count].tolist() == TOKENS[0, 2 + step :].tolist()  # step 0: [4, 5, 6, 7]
    assert mask[0].tolist() == [True] * count + [False] * (5 - count)


def test_the_loss_mask_is_read_at_the_target_token() -> None:
    loss_mask = torch.tensor([[1, 1, 1, 0, 1, 1]])  # token 3 (id 5) is not a target
    _, mask = eagle_targets(_base_logits(), TOKENS, loss_mask, 0)
    assert mask[0].tolist() == [True, False, True, True, False]  # position 1 predicts token 3
    _, mask = eagle_targets(_base_logits(), TOKENS, loss_mask, 1)
    assert mask[0].tolist() == [False, True, True, False, False]  # step 1: position 0 predicts token 3


def test_a_reduced_draft_vocabulary_renormalises_and_maps_ids() -> None:
    logits = _base_logits()
    draft_ids = torch.tensor([1, 4, 5, 7])  # draft id d is target id draft_ids[d]
    targets, mask = eagle_targets(logits, TOKENS, ALL, 0, draft_ids)
    assert targets.shape == (1, 5, 4)
    for t in range(4):
        probs = logits[0, t + 1].softmax(dim=-1)[draft_ids]
        torch.testing.assert_close(targets[0, t], probs / probs.sum())
    ids, mask = eagle_targets(None, TOKENS, ALL, 0, draft_ids, corpus=True, vocab_size=VOCAB)
    # Targets 4, 5, 6, 7: 4 -> draft 1, 5 -> draft 2, 6 is not in the draft vocabulary, 7 -> draft 3.
    assert mask[0].tolist() == [True, True, False, True, False]
    assert ids[0, mask[0]].tolist() == [1, 2, 3]


def _draft_logits_at(offset: int) -> torch.Tensor:
    """``[1, 5, V]`` draft logits that copy the base's logits at position t + offset (zeros past the sequence)."""
    logits = torch.zeros(1, 5, VOCAB)
    count = 6 - offset
    logits[:, : min(count, 5)] = _base_logits()[:, offset : offset + 5]
    return logits


def test_an_off_by_one_target_costs_more() -> None:
    """A step-1 draft that reproduces the base at t + 2 has the least loss (the base's entropy); t + 1 or t + 3 more."""
    targets, mask = eagle_targets(_base_logits(), TOKENS, ALL, 1)
    best = draft_cross_entropy(_draft_logits_at(2), targets, mask)
    entropy = -(targets[mask] * targets[mask].log()).sum(dim=-1).mean()
    torch.testing.assert_close(best, entropy)
    assert draft_cross_entropy(_draft_logits_at(1), targets, mask) > best + 0.5
    assert draft_cross_entropy(_draft_logits_at(3), targets, mask) > best + 0.5
    ids, mask = eagle_targets(None, TOKENS, ALL, 0, corpus=True)
    one_hot = torch.full((1, 5, VOCAB), -20.0)
    one_hot[0, torch.arange(4), TOKENS[0, 2:]] = 20.0  # the token at t + 2
    shifted = torch.full((1, 5, VOCAB), -20.0)
    shifted[0, torch.arange(4), TOKENS[0, 1:5]] = 20.0  # the token at t + 1
    assert draft_cross_entropy(one_hot, ids, mask) < 1e-6
    assert draft_cross_entropy(shifted, ids, mask) > 10


def test_no_counted_target_gives_a_zero_loss_with_a_graph() -> None:
    logits = torch.randn(1, 5, VOCAB, requires_grad=True)
    targets, mask = eagle_targets(_base_logits(), TOKENS, torch.zeros_like(TOKENS), 0)
    loss = draft_cross_entropy(logits, targets, mask)
    assert loss == 0
    loss.backward()
    assert logits.grad is not None


# ---------------------------------------------------------------------------------------------------- EAGLE-1
def test_eagle1_loss_regresses_onto_the_feature_of_t_plus_1() -> None:
    features = torch.randn(1, 6, 4, generator=torch.Generator().manual_seed(0))
    logits = _base_logits()[:, 1:]  # the base's distribution at t + 1: zero excess cross-entropy
    targets, mask = eagle_targets(_base_logits(), TOKENS, ALL, 0)
    ce = draft_cross_entropy(logits, targets, mask)
    loss, parts = eagle1_loss(features[:, 1:], features, mask, ce)
    assert parts["feature_loss"] == 0
    entropy = -(targets[mask] * targets[mask].log()).sum(dim=-1).mean()
    torch.testing.assert_close(parts["ce_loss"], entropy)
    torch.testing.assert_close(loss, 0.1 * entropy)  # default weights 1.0 and 0.1
    # The feature of t itself (no prediction) is wrong; SmoothL1 by hand on the counted positions 0..3.
    loss, parts = eagle1_loss(features[:, :-1], features, mask, ce, feature_weight=2.0, ce_weight=0.5)
    expected = F.smooth_l1_loss(features[0, :4], features[0, 1:5])
    torch.testing.assert_close(parts["feature_loss"], expected)
    torch.testing.assert_close(loss, 2.0 * expected + 0.5 * entropy)
    # Whatever the draft outputs where no target counts does not matter.
    garbage = features[:, 1:].clone()
    garbage[0, 4] = 100.0
    assert eagle1_loss(garbage, features, mask, ce)[1]["feature_loss"] == 0


def test_ttt_weights() -> None:
    torch.testing.assert_close(ttt_weights(4, 0.8), torch.tensor([1.0, 0.8, 0.64, 0.512]))
    assert ttt_weights(1, 0.5).tolist() == [1.0]


# ---------------------------------------------------------------------------------------- the unrolled forward
@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=5, layers=4)


def _heads(base) -> list[EagleHead]:
    torch.manual_seed(0)
    heads = [
        EagleHead.from_base(base, version=1),
        EagleHead.from_base(base, version=3, draft_vocab_size=50, token_counts=torch.arange(96)),
    ]
    with torch.no_grad():  # larger weights than the init, so that a wrong mask or position shows clearly
        for head in heads:
            for parameter in head.parameters():
                parameter.add_(0.1 * torch.randn(parameter.shape))
    return heads


def _decode_like_the_drafter(head: EagleHead, fused: torch.Tensor, tokens: torch.Tensor, t: int, step: int):
    """Step ``step``'s output at position ``t``, the way the drafter computes it: the committed pairs 0..t into a fresh
    cache, then the draft's own outputs fed back one token at a time at positions t + 1 .. t + step."""
    cache = kv_cache.new_cache()
    pairs = t + 1
    mask = torch.ones(pairs, pairs, dtype=torch.bool).tril()[None, None]
    hidden = head.step(tokens[:, 1 : pairs + 1], fused[:, :pairs], torch.arange(pairs)[None], mask, cache)[:, -1:]
    for depth in range(1, step + 1):
        token = tokens[:, t + 1 + depth : t + 2 + depth]  # along the data: token t + 1 + depth
        hidden = head.step(token, hidden, torch.tensor([[t + depth]]), None, cache)
    return hidden[0, 0]


def test_the_unrolled_forward_equals_step_by_step_decoding(base) -> None:
    tokens = torch.randint(2, 96, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = base(tokens, output_hidden_states=True)
        for head in _heads(base):
            features = [out.hidden_states[index] for index in head.hidden_state_layers]
            hiddens, logits = head(tokens, features, None, steps=3)
            fused = head.fuse(features)
            assert len(hiddens) == 3 and hiddens[0].shape == (1, 7, 32)
            assert logits[2].shape == (1, 7, head.config.draft_vocab_size)
            for step in range(3):
                for t in range(7 - step):  # token t + 1 + step must exist
                    expected = _decode_like_the_drafter(head, fused, tokens, t, step)
                    torch.testing.assert_close(hiddens[step][0, t], expected, rtol=1e-4, atol=1e-5)
                    torch.testing.assert_close(logits[step][0, t], head.logits(expected), rtol=1e-4, atol=1e-5)


def test_padding_does_not_reach_the_real_positions(base) -> None:
    """Row 1 is row 0 right-padded with other tokens: its real positions must be unchanged (the mask works)."""
    tokens = torch.randint(2, 96, (2, 9), generator=torch.Generator().manual_seed(2))
    attention_mask = torch.ones_like(tokens)
    attention_mask[1, 6:] = 0
    tokens[1, :6] = tokens[0, :6]
    with torch.no_grad():
        out = base(tokens, output_hidden_states=True)
        alone = base(tokens[1:, :6], output_hidden_states=True)
        for head in _heads(base):
            features = [out.hidden_states[index] for index in head.hidden_state_layers]
            padded, _ = head(tokens, features, attention_mask, steps=2)
            reference, _ = head(tokens[1:, :6], [alone.hidden_states[i] for i in head.hidden_state_layers], None, 2)
            torch.testing.assert_close(padded[0][1, :5], reference[0][0], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(padded[1][1, :4], reference[1][0, :4], rtol=1e-4, atol=1e-5)


# -------------------------------------------------------------------------------------------- draft vocabulary
def test_select_draft_vocab_takes_the_most_frequent_ids_ties_by_lowest_id() -> None:
    counts = torch.tensor([5, 9, 5, 0, 9, 1, 5])
    assert select_draft_vocab(counts, 2).tolist() == [1, 4]
    assert select_draft_vocab(counts, 3).tolist() == [0, 1, 4]  # 5 is shared by 0, 2, 6: the lowest id wins
    assert select_draft_vocab(counts, 5).tolist() == [0, 1, 2, 4, 6]
    assert select_draft_vocab(counts, 7).tolist() == list(range(7))  # unseen id 3 too, when everything is kept
    assert select_draft_vocab(torch.zeros(6), 3).tolist() == [0, 1, 2]
    for size in (0, 8):
        with pytest.raises(ValueError, match="draft_vocab_size"):
            select_draft_vocab(counts, size)


# -------------------------------------------------------------------------------------------- chunked projections
@pytest.mark.parametrize("corpus", [False, True])
def test_eagle_loss_equals_the_loss_of_the_logits_gradients_included(base, corpus: bool) -> None:
    """All unrolled steps in one chunked call: the same as each step's logits against eagle_targets, weighted."""
    tokens = torch.randint(2, 96, (2, 9), generator=torch.Generator().manual_seed(3))
    loss_mask = torch.ones_like(tokens)
    loss_mask[0, 4] = 0
    with torch.no_grad():
        out = base(tokens, output_hidden_states=True)
    for head in _heads(base):
        features = [out.hidden_states[index] for index in head.hidden_state_layers]
        draft_ids = head.draft_token_ids() if head.config.reduced_vocab else None
        weights = ttt_weights(3, 0.8)
        hiddens, logits = head(tokens, features, None, steps=3)
        reference = sum(
            weights[step]
            * draft_cross_entropy(
                logits[step], *eagle_targets(out.logits, tokens, loss_mask, step, draft_ids, corpus, 96)
            )
            for step in range(3)
        )
        projections = [head.projection(hidden) for hidden in hiddens]
        inputs = [projection[0] for projection in projections]
        _, weight, bias = projections[0]
        result = eagle_loss(inputs, weight, bias, weights, out.logits, tokens, loss_mask, draft_ids, corpus, 96, 1)
        torch.testing.assert_close(result.loss, reference)
        parameters = [p for p in head.parameters() if p.requires_grad]
        expected = torch.autograd.grad(reference, parameters, retain_graph=True, allow_unused=True)
        got = torch.autograd.grad(result.loss, parameters, allow_unused=True)
        for got_grad, expected_grad in zip(got, expected, strict=True):
            assert (got_grad is None) == (expected_grad is None)
            if got_grad is not None:
                torch.testing.assert_close(got_grad, expected_grad, rtol=1e-4, atol=1e-6)
        for step in range(3):
            _, mask = eagle_targets(out.logits, tokens, loss_mask, step, draft_ids, corpus, 96)
            assert torch.equal(result.masks[step], mask)
            assert torch.equal(result.tops[step][:, 0], logits[step][mask].argmax(dim=-1))
