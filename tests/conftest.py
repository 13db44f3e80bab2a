"""Test session set-up: offline hub, offline trackers, one thread."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import PreTrainedModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
# Tiny models gain nothing from more threads, and one thread keeps the suite from thrashing on a shared machine.
torch.set_num_threads(int(os.environ.get("SPECHEADS_TEST_THREADS", "1")))

from helpers import tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def llama() -> PreTrainedModel:
    return tiny_model("llama")
