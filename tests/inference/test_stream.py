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
