"""The greedy invariant: speculative output equals transformers' greedy output, token for token."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import ARCHITECTURES, OracleTreeDrafter, greedy_reference, tiny_model

from specheads import SpecDecoder
from specheads.inference.drafters import DraftModelDrafter, NoDrafter, PromptLookupDrafter
from specheads.inference.trees import resolve_tree

PROMPT_LENGTHS = (1, 5, 23)


def _prompt(length: int, seed: int, vocab: int = 96) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (1, length), generator=generator)


def _repetitive_prompt(length: int, seed: int) -> torch.Tensor:
    """A prompt with repeated n-grams, so that prompt lookup finds matches."""
    piece = _prompt(6, seed)
    return piece.repeat(1, length // 6 + 1)[:, :length]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_drafter_matches_greedy(arch: str) -> None:
    base = tiny_model(arch, seed=1)
    other = tiny_model(arch, seed=2, hidden=16, layers=1)
    drafters = {
        "none": NoDrafter(),
        "draft-identical-k3": DraftModelDrafter(base, 3),
        "draft-other-k1": DraftModelDrafter(other, 1),
        "draft-other-k5": DraftModelDrafter(other, 5),
        "prompt-lookup": PromptLookupDrafter(4),
        "oracle-tree": OracleTreeDrafter(base, resolve_tree([[0], [1], [0, 0], [1, 0], [0, 1], [0, 0, 0]])),
    }
    for length in PROMPT_LENGTHS:
        prompt = _repetitive_prompt(length, seed=length) if length > 1 else _prompt(1, seed=3)
        reference = greedy_reference(base, prompt, max_new_tokens=24)
        for name, drafter in drafters.items():
            out = SpecDecoder(base, drafter).generate(prompt, max_new_tokens=24)
            assert torch.equal(out.sequences, reference), f"{arch} {name} prompt length {length}"
            assert out.new_tokens == reference[0, length:].tolist()
            assert out.stats.new_tokens == 24 == sum(out.stats.accepted_lengths)


def test_identical_draft_accepts_everything(llama) -> None:
    prompt = _prompt(8, seed=4)
    out = SpecDecoder(llama, DraftModelDrafter(llama, 4)).generate(prompt, max_new_tokens=30)
    assert torch.equal(out.sequences, greedy_reference(llama, prompt, 30))
    assert out.stats.mean_accepted_length == pytest.approx(5.0)  # 30 tokens in 6 steps of 4 drafts + 1 bonus
    assert out.stats.acceptance_rate_by_position == [1.0, 1.0, 1.0, 1.0]


def test_different_draft_is_rejected_often_and_stays_exact(llama) -> None:
    other = tiny_model("llama", seed=7, hidden=16, layers=1)
    prompt = _prompt(8, seed=5)
    out = SpecDecoder(llama, DraftModelDrafter(other, 5)).generate(prompt, max_new_tokens=40)
    assert torch.equal(out.sequences, greedy_reference(llama, prompt, 40))
    assert out.stats.acceptance_rate_by_position[0] < 0.5
    assert out.stats.steps > 40 / 3


@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_draft_lengths(llama, k: int) -> None:
    prompt = _prompt(6, seed=k)
    drafter = DraftModelDrafter(llama, 3)
    out = SpecDecoder(llama, drafter).generate(prompt, max_new_tokens=19, num_speculative_tokens=k)
    assert torch.equal(out.sequences, greedy_reference(llama, prompt, 19))
    assert max(out.stats.drafted_depths) <= k


def test_max_new_tokens_cuts_an_accepted_run(llama) -> None:
    prompt = _prompt(5, seed=9)
    for max_new in (1, 2, 7, 11):
        out = SpecDecoder(llama, DraftModelDrafter(llama, 5)).generate(prompt, max_new_tokens=max_new)
        assert len(out.new_tokens) == max_new
        assert torch.equal(out.sequences, greedy_reference(llama, prompt, max_new))
        # The engine never drafts past what the budget can use.
        assert max(out.stats.drafted_depths) <= max_new - 1


@pytest.mark.parametrize("method", ["draft", "tree", "lookup"])
def test_eos_inside_an_accepted_run_ends_generation(llama, method: str) -> None:
    prompt = _repetitive_prompt(18, seed=11)
    free_run = greedy_reference(llama, prompt, 30)[0, 18:].tolist()
    eos = free_run[9]  # a token the base emits mid-run; its first occurrence ends generation
    reference = greedy_reference(llama, prompt, 30, eos_token_id=eos)
    drafter = {
        "draft": DraftModelDrafter(llama, 6),
        "tree": OracleTreeDrafter(llama, resolve_tree("chain-6")),
        "lookup": PromptLookupDrafter(6),
    }[method]
    out = SpecDecoder(llama, drafter).generate(prompt, max_new_tokens=30, eos_token_id=eos)
    assert out.new_tokens[-1] == eos and eos not in out.new_tokens[:-1]
    assert torch.equal(out.sequences, reference)


def test_generation_config_eos_is_the_default(llama) -> None:
    prompt = _prompt(5, seed=12)
    free_run = greedy_reference(llama, prompt, 20)[0, 5:].tolist()
    model = tiny_model("llama")
    model.generation_config.eos_token_id = free_run[4]
    out = SpecDecoder(model, DraftModelDrafter(model, 3)).generate(prompt, max_new_tokens=20)
    assert out.new_tokens == free_run[: free_run.index(free_run[4]) + 1]


def test_oracle_tree_uses_branches_and_rejections(llama) -> None:
    tree = resolve_tree([[0], [1], [2], [0, 0], [1, 0], [2, 1], [0, 0, 0], [1, 0, 0]])
    prompt = _prompt(9, seed=13)
    reference = greedy_reference(llama, prompt, 40)
    for seed, wrong_after in [(0, None), (1, 1), (2, 2)]:
        drafter = OracleTreeDrafter(llama, tree, seed=seed, wrong_after=wrong_after)
        out = SpecDecoder(llama, drafter).generate(prompt, max_new_tokens=40)
        assert torch.equal(out.sequences, reference)
        # Every depth-1 rank exists, so at least one draft is accepted per step (except a cut last step).
        assert out.stats.mean_accepted_length > 1.8
        limit = wrong_after if wrong_after is not None else tree.max_depth
        assert min(limit, 2) <= max(out.stats.accepted_drafts) <= limit


def test_prompt_lookup_finds_repeats(llama) -> None:
    prompt = _repetitive_prompt(30, seed=14)
    out = SpecDecoder(llama, PromptLookupDrafter(5)).generate(prompt, max_new_tokens=20)
    assert torch.equal(out.sequences, greedy_reference(llama, prompt, 20))
    assert out.stats.steps < 20 and sum(out.stats.accepted_drafts) > 0  # the repeats were copied, in fewer steps


def test_generation_stops_at_the_model_length_limit() -> None:
    model = tiny_model("gpt2", max_positions=32)
    prompt = _prompt(25, seed=15)
    out = SpecDecoder(model, DraftModelDrafter(model, 4)).generate(prompt, max_new_tokens=50)
    assert out.sequences.shape[1] == 32
    assert torch.equal(out.sequences, greedy_reference(model, prompt, 7))


@pytest.mark.parametrize("threshold", [0.0, 0.02, 0.5])
def test_confidence_threshold_changes_only_the_proposals(threshold: float) -> None:
    base = tiny_model("llama", seed=1, logit_scale=8)
    draft = tiny_model("llama", seed=1, logit_scale=8, hidden=32)  # same weights: confident, mostly right
    prompt = _prompt(7, seed=16)
    drafter = DraftModelDrafter(draft, 6, confidence_threshold=threshold)
    out = SpecDecoder(base, drafter).generate(prompt, max_new_tokens=30)
    assert torch.equal(out.sequences, greedy_reference(base, prompt, 30))
    if threshold == 0.5:
        assert min(out.stats.drafted_depths) < 6  # some proposals were cut short


def test_confidence_threshold_is_checked() -> None:
    with pytest.raises(ValueError, match="confidence_threshold"):
        DraftModelDrafter(tiny_model("llama"), 3, confidence_threshold=1.5)


class _SlowUpdate(PromptLookupDrafter):
    """Prompt lookup whose update after each commit takes (at least) ``pause`` seconds."""

    def __init__(self, pause: float) -> None:
        super().__init__(3)
        self.pause = pause

    def accepted(self, state, num_accepted) -> None:
        time.sleep(self.pause)
        super().accepted(state, num_accepted)


@pytest.mark.parametrize("batch", [1, 3])
def test_the_drafters_update_after_a_commit_is_draft_time(llama, batch: int) -> None:
    """A drafter's ``accepted`` work (an EAGLE head's fc over the base's new features) is drafting: every step's
    pause lands in the draft time, not the verify time, and the split still adds up within the wall time."""
    pause = 0.03
    prompts = [_repetitive_prompt(12 + i, seed=20 + i)[0] for i in range(batch)]
    out = SpecDecoder(llama, _SlowUpdate(pause)).generate(prompts if batch > 1 else prompts[0], max_new_tokens=6)
    outputs = out if batch > 1 else [out]
    for single in outputs:
        stats = single.stats
        assert stats.draft_time_s >= stats.steps * pause  # a sleep lasts at least its time
        assert stats.draft_time_s + stats.verify_time_s <= stats.wall_time_s
    if batch > 1:
        steps = max(single.stats.steps for single in outputs)
        assert out.stats.draft_time_s >= steps * pause
        assert out.stats.draft_time_s + out.stats.verify_time_s <= out.stats.wall_time_s
