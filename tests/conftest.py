"""Test session set-up: offline hub, offline trackers, two threads at most."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import PreTrainedModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
torch.set_num_threads(min(2, torch.get_num_threads()))

from helpers import tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def llama() -> PreTrainedModel:
    return tiny_model("llama")
