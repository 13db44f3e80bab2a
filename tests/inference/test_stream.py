"""Streaming and decoded text."""

from __future__ import annotations

from helpers import tiny_model, tiny_tokenizer

from specheads import SpecDecoder
from specheads.inference.drafters import DraftModelDrafter


def test_stream_pieces_add_up_to_the_generated_text() -> None:
    base = tiny_model("qwen2", seed=5)
    decoder = SpecDecoder(
        base, DraftModelDrafter(tiny_model("qwen2", seed=6, hidden=16, layers=1), 3), tokenizer=tiny_tokenizer()
    )
    out = decoder.generate("def add(a, b):", max_new_tokens=30)
    pieces = list(decoder.stream("def add(a, b):", max_new_tokens=30))
    assert len(pieces) > 1
    assert "".join(pieces) == out.text
    assert out.text == decoder.tokenizer.decode(out.new_tokens, skip_special_tokens=True)


def test_stream_at_a_temperature_draws_what_generate_draws_with_the_same_seed() -> None:
    base = tiny_model("qwen2", seed=5)
    decoder = SpecDecoder(
        base, DraftModelDrafter(tiny_model("qwen2", seed=6, hidden=16, layers=1), 3), tokenizer=tiny_tokenizer()
    )
    settings = dict(max_new_tokens=30, temperature=0.8, seed=0, acceptance="rejection")
    out = decoder.generate("def add(a, b):", **settings)
    assert "".join(decoder.stream("def add(a, b):", **settings)) == out.text
    other = decoder.generate("def add(a, b):", **{**settings, "seed": 1})
    assert other.new_tokens != out.new_tokens  # the seed decides the draw: the comparison above is not vacuous


def test_profile_changes_the_timings_only() -> None:
    base = tiny_model("qwen2", seed=5)
    draft = tiny_model("qwen2", seed=6, hidden=16, layers=1)
    plain = SpecDecoder(base, DraftModelDrafter(draft, 3), tokenizer=tiny_tokenizer())
    profiled = SpecDecoder(base, DraftModelDrafter(draft, 3), tokenizer=tiny_tokenizer(), profile=True)
    first = plain.generate("def add(a, b):", max_new_tokens=20)
    second = profiled.generate("def add(a, b):", max_new_tokens=20)
    assert first.new_tokens == second.new_tokens
    assert second.stats.draft_time_s > 0 and second.stats.verify_time_s > 0
