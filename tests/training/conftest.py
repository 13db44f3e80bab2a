"""Fixtures of the training tests: a private rows cache per test and a tokenizer with a ChatML template."""

from __future__ import annotations

import datasets
import pytest
from chat_helpers import CHATML
from helpers import tiny_tokenizer


@pytest.fixture(autouse=True)
def rows_cache(tmp_path_factory, monkeypatch):
    """Cached rows go to a fresh folder per test, not to the user's datasets cache."""
    folder = tmp_path_factory.mktemp("datasets-cache")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def chat_tokenizer():
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tokenizer.chat_template = CHATML
    return tokenizer
