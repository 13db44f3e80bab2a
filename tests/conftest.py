"""Test session set-up: offline hub, offline trackers, two threads at most."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import PreTrainedModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
# SPECHEADS_TEST_THREADS=1 keeps a test run from thrashing against a background training job.
torch.set_num_threads(int(os.environ.get("SPECHEADS_TEST_THREADS", min(2, torch.get_num_threads()))))

from helpers import tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def llama() -> PreTrainedModel:
    return tiny_model("llama")
