"""Helpers of the training tests: a workspace with a tiny base and code text, the trained heads' state, and the
environment of training subprocesses."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from helpers import tiny_model, tiny_tokenizer

from specheads.heads import load_heads

TEXT = (
    "def add(a, b):\n    return a + b\n\n\nclass Stack:\n    def push(self, item):\n        self.items.append(item)\n"
)


def make_workspace(root: Path, layers: int = 2) -> Path:
    """``root/base`` (a tiny Llama and its tokenizer) and ``root/data`` (12 files of code text)."""
    tiny_model("llama", seed=1, layers=layers).save_pretrained(root / "base")
    tiny_tokenizer().save_pretrained(root / "base")
    data = root / "data"
    data.mkdir()
    for index in range(12):
        (data / f"doc{index:02d}.txt").write_text(TEXT * (2 + index % 3))
    return root


def heads_state(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of the heads saved at ``path``."""
    return load_heads(path).state_dict()


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a training subprocess: offline, one thread, no tokenizer threads."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **extra}
