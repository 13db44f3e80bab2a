"""Bad input: each is a clear error raised before any model compute, never a crash deeper down."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import greedy_reference, tiny_model

from specheads import GenerationConfig, SpecDecoder, TreeError
from specheads.inference import kv_cache
from specheads.inference.drafters import DraftModelDrafter, NoDrafter, PromptLookupDrafter

PROMPT = torch.tensor([[5, 6, 7]])


@pytest.fixture(scope="module")
def decoder(llama) -> SpecDecoder:
    return SpecDecoder(llama, DraftModelDrafter(llama, 3))


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "list of prompts is empty"),
        (torch.zeros(1, 0, dtype=torch.long), "empty"),
        ([5, 999], "token ids"),
        ("a string", "tokenizer"),
    ],
)
def test_bad_prompts(decoder: SpecDecoder, prompt, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decoder.generate(prompt, max_new_tokens=4)


BAD_ARGUMENTS = [
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    (dict(max_new_tokens=-3), ValueError, "max_new_tokens"),
    (dict(temperature=-0.5), ValueError, "temperature"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(top_p=0.0), ValueError, "top_p"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(top_k=-1), ValueError, "top_k"),
    (dict(acceptance="magic"), ValueError, "unknown acceptance rule"),
    (dict(acceptance="greedy", temperature=0.7), ValueError, "rejection"),
    (dict(tree=[[0], [0, 0, 0]]), TreeError, "no parent"),
    (dict(tree=[[0], [1]]), ValueError, "chains"),
    (dict(tree="no-such-tree"), TreeError, "unknown tree"),
    (dict(num_speculative_tokens=0), ValueError, "num_speculative_tokens"),
    (dict(frobnicate=True), TypeError, "unknown arguments"),
]
# Refused by the drafter (it alone knows its trees and chain lengths), not by GenerationConfig itself.
DRAFTER_CHECKED = ("tree", "num_speculative_tokens")


@pytest.mark.parametrize(("kwargs", "error", "message"), BAD_ARGUMENTS)
def test_bad_generation_arguments(decoder: SpecDecoder, kwargs: dict, error: type, message: str) -> None:
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(error, match=message):
        decoder.generate(PROMPT, **kwargs)
    with pytest.raises(error, match=message):  # the same check without a prompt or any compute
        decoder.check(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"), [row for row in BAD_ARGUMENTS if not set(row[0]) & set(DRAFTER_CHECKED)]
)
def test_generation_config_refuses_what_generate_refuses(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        GenerationConfig.from_kwargs(**kwargs)


def test_generation_config_is_the_arguments_of_generate(decoder: SpecDecoder) -> None:
    """A config object and the same keywords decode the same; keywords override the config's fields."""
    config = GenerationConfig(max_new_tokens=6, temperature=0.8, seed=3)
    by_config = decoder.generate(PROMPT, generation_config=config)
    by_keywords = decoder.generate(PROMPT, max_new_tokens=6, temperature=0.8, seed=3)
    assert by_config.new_tokens == by_keywords.new_tokens and len(by_config.new_tokens) == 6
    greedy = GenerationConfig(max_new_tokens=6)
    shorter = decoder.generate(PROMPT, generation_config=greedy, max_new_tokens=2)  # the keyword wins
    assert shorter.new_tokens == decoder.generate(PROMPT, generation_config=greedy).new_tokens[:2]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.temperature = 0.0  # type: ignore[misc]


def test_prompt_at_or_over_the_model_length() -> None:
    model = tiny_model("gpt2", max_positions=16)
    decoder = SpecDecoder(model, PromptLookupDrafter(3))
    for length in (16, 40):
        with pytest.raises(ValueError, match="at most 16 positions"):
            decoder.generate(torch.full((1, length), 5), max_new_tokens=2)


def test_draft_model_with_another_vocabulary(llama) -> None:
    other = tiny_model("llama", vocab_size=128)
    with pytest.raises(ValueError, match="vocabulary"):
        SpecDecoder(llama, DraftModelDrafter(other, 3))


def test_unknown_method() -> None:
    with pytest.raises(ValueError, match="unknown method"):
        SpecDecoder.from_pretrained(tiny_model("llama"), method="telepathy")


def test_method_none_takes_no_tree(llama) -> None:
    with pytest.raises(ValueError, match="no tree"):
        SpecDecoder(llama, NoDrafter()).generate(PROMPT, max_new_tokens=3, tree="chain-2")


def test_a_failed_call_leaves_the_decoder_usable(decoder: SpecDecoder, llama) -> None:
    with pytest.raises(ValueError):
        decoder.generate(PROMPT, max_new_tokens=0)
    out = decoder.generate(PROMPT, max_new_tokens=5)
    assert len(out.new_tokens) == 5


def test_alpha_is_refused_for_drafters_without_draft_probabilities(llama) -> None:
    calls: list[int] = []
    handle = llama.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        for decoder, kwargs in [
            (SpecDecoder(llama, PromptLookupDrafter(3)), dict(temperature=1.0)),
            (SpecDecoder(llama, DraftModelDrafter(llama, 3)), dict(temperature=0.0)),
        ]:
            with pytest.raises(ValueError, match="acceptance='alpha' needs draft probabilities"):
                decoder.generate([5, 6, 7], max_new_tokens=4, acceptance="alpha", **kwargs)
    finally:
        handle.remove()
    assert not calls
    out = SpecDecoder(llama, DraftModelDrafter(llama, 3)).generate(
        [5, 6, 7], max_new_tokens=4, acceptance="alpha", temperature=1.0, seed=0
    )
    assert len(out.new_tokens) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(seed="x"), "seed must be an integer"),
        (dict(seed=1.5), "seed must be an integer"),
        (dict(tree=[]), "tree=\\[\\] drafts nothing"),
    ],
)
def test_bad_generate_arguments_are_named(llama, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpecDecoder(llama, PromptLookupDrafter(3)).generate([5, 6, 7], max_new_tokens=4, **kwargs)


def test_a_medusa_tree_wider_than_the_vocabulary_is_named(llama) -> None:
    from specheads.heads import MedusaHeads
    from specheads.methods.medusa.drafter import MedusaDrafter

    decoder = SpecDecoder(llama, MedusaDrafter(MedusaHeads.from_base(llama, num_heads=2)))
    with pytest.raises(ValueError, match="rank 9999 but the vocabulary has"):
        decoder.generate([5, 6, 7], max_new_tokens=4, tree=[[9999]])


def test_output_cut_by_the_position_limit_says_so() -> None:
    model = tiny_model("llama", max_positions=16)
    decoder = SpecDecoder(model, DraftModelDrafter(tiny_model("llama", seed=1, max_positions=16), 3))
    out = decoder.generate(torch.full((1, 10), 5), max_new_tokens=20)
    assert (len(out.new_tokens), out.finish_reason, out.tokens_cut) == (6, "max_length", 14)
    full = decoder.generate(torch.full((1, 4), 5), max_new_tokens=5)
    assert (len(full.new_tokens), full.finish_reason, full.tokens_cut) == (5, "max_new_tokens", 0)
    eos = full.new_tokens[1]
    stopped = decoder.generate(torch.full((1, 4), 5), max_new_tokens=5, eos_token_id=eos)
    assert (stopped.new_tokens[-1], stopped.finish_reason, stopped.tokens_cut) == (eos, "eos", 0)
    batch = decoder.generate([torch.full((10,), 5), torch.full((4,), 5)], max_new_tokens=8)
    assert [(o.finish_reason, o.tokens_cut) for o in batch] == [("max_length", 2), ("max_new_tokens", 0)]


def _allocated_slots(decoder: SpecDecoder, monkeypatch, prompts, max_new_tokens: int):
    """The output of ``decoder.generate`` and the slots of every key/value buffer the call allocated."""
    caches = []
    real = kv_cache.new_cache

    def recording(*args, **kwargs):
        caches.append(real(*args, **kwargs))
        return caches[-1]

    with monkeypatch.context() as patch:
        patch.setattr(kv_cache, "new_cache", recording)
        out = decoder.generate(prompts, max_new_tokens=max_new_tokens)
    return out, [buffer.shape[2] for cache in caches for buffer in cache.buffers]


def test_a_huge_max_new_tokens_allocates_only_what_the_model_positions_can_use(monkeypatch) -> None:
    """Prompt + new tokens never exceed the model's positions, so the token buffer and every cache (the base's and
    the draft model's) are sized as for the largest request that fits, and generation ends with "max_length"."""
    positions = 24
    model = tiny_model("llama", max_positions=positions)
    decoder = SpecDecoder(model, DraftModelDrafter(tiny_model("llama", seed=1, max_positions=positions), 3))
    prompt = torch.tensor([[5, 6, 7, 8]])
    fits = positions - prompt.shape[1]
    exact, exact_slots = _allocated_slots(decoder, monkeypatch, prompt, fits)
    huge, huge_slots = _allocated_slots(decoder, monkeypatch, prompt, 10_000)
    assert exact_slots and huge_slots == exact_slots
    assert max(huge_slots) <= positions + 2 * 3 + 2  # the positions, plus room for one verify step
    assert (huge.finish_reason, huge.tokens_cut) == ("max_length", 10_000 - fits)
    assert huge.new_tokens == exact.new_tokens == greedy_reference(model, prompt, fits)[0, 4:].tolist()
    ragged = [torch.tensor([5, 6, 7, 8, 9, 10]), torch.tensor([5, 6])]
    outs, ragged_slots = _allocated_slots(decoder, monkeypatch, ragged, 10_000)
    assert max(ragged_slots) == max(exact_slots)  # the longest row's positions bound the batch's buffers
    assert [(len(out.new_tokens), out.finish_reason) for out in outs] == [(18, "max_length"), (22, "max_length")]
    assert decoder.generate(prompt, max_new_tokens=10**9).new_tokens == exact.new_tokens  # 832 GB before the cap
