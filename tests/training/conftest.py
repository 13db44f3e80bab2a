"""Fixtures of the training tests: a private rows cache per test and a tokenizer with a ChatML template."""

from __future__ import annotations

import pytest
from chat_helpers import CHATML
from helpers import tiny_tokenizer
from training_helpers import rows_cache  # noqa: F401 - autouse: shared with the methods' trainer tests


@pytest.fixture(scope="module")
def chat_tokenizer():
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tokenizer.chat_template = CHATML
    return tokenizer
