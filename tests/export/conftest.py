"""Shared fixtures: a tiny Llama base (8 layers, so EAGLE-3's default feature layers are distinct) and heads of every
type trained for a few seconds on its own samples, so that decoding with them accepts multi-token runs."""

from __future__ import annotations

import pytest
import torch
from helpers import base_samples, tiny_model, train_eagle_head, train_medusa_heads

VOCAB = 96


@pytest.fixture(scope="package")
def base():
    return tiny_model("llama", seed=1, vocab_size=VOCAB, layers=8, logit_scale=4.0)


@pytest.fixture(scope="package")
def trained(base) -> dict[str, torch.nn.Module]:
    sequences = base_samples(base)
    counts = torch.bincount(sequences.flatten(), minlength=VOCAB)
    return {
        "eagle3": train_eagle_head(base, sequences, version=3, draft_vocab_size=64, token_counts=counts),
        "eagle3-full": train_eagle_head(base, sequences, steps=60, version=3),
        "eagle1": train_eagle_head(base, sequences, version=1, fc_bias=False),
        "eagle1-bias": train_eagle_head(base, sequences, steps=60, version=1),
        "medusa": train_medusa_heads(base, sequences, num_heads=3),
        "medusa-shared": train_medusa_heads(base, sequences, num_heads=3, share_lm_head=True),
    }
