"""Every head type on a base whose lm_head is past 2**24 elements, where float32 index arithmetic and full-vocabulary
tensors first bite (real bases: SmolLM2-135M's lm_head has 28.3M elements). Through the public paths, end to end:
``train`` (a recipe, as ``specheads train`` runs it) -> load (the fingerprint check) -> decode (speculative output ==
the base's greedy output) -> ``specheads export`` -> ``specheads export --check`` -> load the export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import greedy_reference, tiny_model, tiny_tokenizer

from specheads import SpecDecoder
from specheads.cli import main
from specheads.heads import load_heads
from specheads.training.config import load_config
from specheads.training.trainer import train

VOCAB, HIDDEN = 65536, 264  # lm_head: 17,301,504 elements, past 2**24 = 16,777,216
TEXT = (
    "def add(a, b):\n    return a + b\n\n\nclass Stack:\n    def push(self, item):\n        self.items.append(item)\n"
)
PROMPT = [5, 40, 65535, 12, 60001, 33]  # ids from both ends of the vocabulary

# Each head type: its recipe's heads/lora settings and the export formats that serve it.
KINDS = {
    "medusa1": ({"heads.type": "medusa", "heads.num_heads": 2}, ["medusa"]),
    "medusa2": (
        {
            "heads.type": "medusa",
            "heads.num_heads": 2,
            "heads.share_lm_head": "true",
            "lora.enabled": "true",
            "lora.r": 4,
            "lora.alpha": 8,
            "lora.stage1_steps": 1,
        },
        ["medusa"],
    ),
    "eagle1": ({"heads.type": "eagle", "heads.version": 1}, ["eagle"]),
    "eagle3": (
        {
            "heads.type": "eagle",
            "heads.version": 3,
            "heads.layer_ids": "[1,2,3]",  # distinct on 4 layers, as the eagle3 export needs
            "heads.draft_vocab_size": 512,
            "heads.ttt_steps": 2,
        },
        ["eagle3", "speculators"],
    ),
    "dflash": (
        {"heads.type": "dflash", "heads.num_layers": 1, "heads.block_size": 4, "heads.num_anchors": 4,
         "heads.layer_ids": "[1,2,3]"},
        ["dflash", "speculators"],
    ),
    "dspark": (
        {"heads.type": "dflash", "heads.variant": "dspark", "heads.num_layers": 1, "heads.block_size": 4,
         "heads.num_anchors": 4, "heads.markov_rank": 8, "heads.layer_ids": "[1,2,3]"},
        ["dspark", "speculators"],
    ),
}  # fmt: skip

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The base (4 layers: EAGLE-3's three feature layers are distinct), its tokenizer and a few KB of text."""
    root = tmp_path_factory.mktemp("real-size")
    base = tiny_model("llama", seed=1, vocab_size=VOCAB, hidden=HIDDEN, layers=4)
    assert base.get_output_embeddings().weight.numel() > 2**24
    base.save_pretrained(root / "base")
    tiny_tokenizer(VOCAB).save_pretrained(root / "base")
    data = root / "data"
    data.mkdir()
    for index in range(6):
        (data / f"doc{index}.txt").write_text(TEXT * (2 + index % 3))
    return root


def _recipe(workspace: Path, out: Path, settings: dict) -> list[str]:
    values = {
        "model.base": str(workspace / "base"),
        "data.paths": f"[{workspace / 'data'}]",
        "data.format": "text",
        "data.max_length": 24,
        "train.batch_size": 2,
        "train.steps": 2,
        "train.lr": 3e-3,
        "output.dir": str(out),
        "output.save_every": 0,
        "output.keep_last": 1,
        "log.every": 1,  # every step logs: the metrics' top-k paths run too
        **settings,
    }
    return [f"{key}={value}" for key, value in values.items()]


@pytest.mark.parametrize("kind", list(KINDS))
def test_train_load_decode_export_at_a_real_vocabulary_size(workspace, tmp_path, kind: str, capsys) -> None:
    settings, formats = KINDS[kind]
    heads_dir = train(load_config(None, _recipe(workspace, tmp_path / "run", settings)))

    decoder = SpecDecoder.from_pretrained(str(workspace / "base"), heads=str(heads_dir))  # checks the fingerprint
    prompt = torch.tensor([PROMPT])
    out = decoder.generate(prompt, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(decoder.model, prompt, 12))  # Medusa-2: the merged base

    base = decoder.model if kind != "medusa2" else None  # Medusa-2's heads belong to the base before the merge
    for layout in formats:
        exported = tmp_path / layout
        command = ["export", "--heads", str(heads_dir), "--format", layout, "--base", str(workspace / "base")]
        assert main([*command, "--out", str(exported)]) == 0, capsys.readouterr().err
        assert main(["export", "--check", str(exported), "--format", layout]) == 0, capsys.readouterr().err
        imported = load_heads(exported, base_model=base or _fresh_base(workspace))  # the fingerprint again
        assert imported.config.vocab_size == VOCAB


def _fresh_base(workspace: Path) -> torch.nn.Module:
    from specheads.loading import load_causal_lm

    return load_causal_lm(str(workspace / "base"))
