"""The shipped tokenizers know the models' real position limit, so long inputs raise no false length warning."""

from __future__ import annotations

import json
import logging

import pytest
from transformers import AutoTokenizer

from specheads import assets


@pytest.mark.parametrize("role", ["base", "draft"])
def test_model_max_length_is_the_models_position_limit(role: str) -> None:
    folder = assets.DEFAULT_DIR / role
    config = json.loads((folder / "config.json").read_text())
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == config["max_position_embeddings"]
    assert AutoTokenizer.from_pretrained(folder).model_max_length == config["max_position_embeddings"]


def test_a_1000_token_text_gives_no_indexing_error_warning(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = AutoTokenizer.from_pretrained(assets.resolve("default"))
    text = "".join(f"def function_{i}(value):\n    return value * {i}\n\n" for i in range(70))
    with caplog.at_level(logging.WARNING, logger="transformers"):
        ids = tokenizer(text)["input_ids"]
    assert 1000 <= len(ids) <= tokenizer.model_max_length
    assert "indexing errors" not in caplog.text
