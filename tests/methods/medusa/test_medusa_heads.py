"""Medusa heads: initialisation, the native checkpoint, and what loading refuses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_model

from specheads.heads import HeadCheckpointError, MedusaHeads, load_heads
from specheads.heads.checkpoint import fingerprint


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=1)


def test_fresh_heads_reproduce_the_base_lm_head(base) -> None:
    heads = MedusaHeads.from_base(base, num_heads=3, num_layers=2)
    hidden = torch.randn(2, 5, base.config.hidden_size)
    logits = heads(hidden)
    assert logits.shape == (3, 2, 5, base.config.vocab_size)
    expected = base.get_output_embeddings()(hidden)
    for head in range(3):
        torch.testing.assert_close(logits[head], expected)


@pytest.mark.parametrize("share_lm_head", [False, True])
def test_a_readout_gets_what_each_heads_projection_reads(base, share_lm_head: bool) -> None:
    heads = MedusaHeads.from_base(base, num_heads=3, num_layers=1, share_lm_head=share_lm_head)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(2)))
    hidden = torch.randn(2, 5, base.config.hidden_size)
    projected = heads(hidden, readout=lambda index, states, weight, bias: (index, F.linear(states, weight, bias)))
    assert [index for index, _ in projected] == [0, 1, 2]
    torch.testing.assert_close(torch.stack([logits for _, logits in projected]), heads(hidden))


def test_every_block_is_its_own_module(base) -> None:
    heads = MedusaHeads.from_base(base, num_heads=2, num_layers=3)
    blocks = [block for head in heads.blocks for block in head]
    assert len({id(block) for block in blocks}) == 6
    assert len({block.linear.weight.data_ptr() for block in blocks}) == 6


def test_save_and_load_round_trip(base, tmp_path) -> None:
    heads = MedusaHeads.from_base(base, num_heads=2, num_layers=1)
    with torch.no_grad():
        heads.blocks[1][0].linear.weight.normal_()
    heads.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_heads(tmp_path, base)
    hidden = torch.randn(1, 3, base.config.hidden_size)
    torch.testing.assert_close(loaded(hidden), heads(hidden))
    assert loaded.config.base_model["fingerprint"] == fingerprint(base)


def test_shared_lm_head_is_not_saved_and_is_rebound(base, tmp_path) -> None:
    heads = MedusaHeads.from_base(base, num_heads=2, share_lm_head=True)
    heads.save_pretrained(tmp_path)
    loaded = load_heads(tmp_path, base)
    assert not any("lm_head" in name for name in loaded.state_dict())
    hidden = torch.randn(1, 2, base.config.hidden_size)
    torch.testing.assert_close(loaded(hidden), heads(hidden))


@pytest.mark.parametrize(
    ("other", "field"),
    [
        (dict(arch="llama", seed=9), "fingerprint"),
        (dict(arch="llama", seed=1, hidden=48), "hidden_size"),
        (dict(arch="llama", seed=1, vocab_size=128), "vocab_size"),
        (dict(arch="llama", seed=1, layers=3), "num_hidden_layers"),
    ],
)
def test_heads_for_another_base_are_refused_naming_the_field(base, tmp_path, other, field) -> None:
    MedusaHeads.from_base(base, num_heads=2).save_pretrained(tmp_path)
    with pytest.raises(HeadCheckpointError, match=f"base_model.{field}"):
        load_heads(tmp_path, tiny_model(**other))


def test_the_same_base_in_another_dtype_is_accepted(base, tmp_path) -> None:
    MedusaHeads.from_base(base, num_heads=2).save_pretrained(tmp_path)
    half = tiny_model("llama", seed=1).to(torch.bfloat16)
    heads = load_heads(tmp_path, half)
    assert next(heads.parameters()).dtype == torch.bfloat16


def test_pickles_are_refused(base, tmp_path) -> None:
    heads = MedusaHeads.from_base(base, num_heads=2)
    torch.save(heads.state_dict(), tmp_path / "medusa_lm_head.pt")
    with pytest.raises(HeadCheckpointError, match="never unpickles"):
        load_heads(tmp_path / "medusa_lm_head.pt")
    with pytest.raises(HeadCheckpointError, match="never unpickles"):
        load_heads(tmp_path)  # a directory holding only a pickle


def test_corrupt_and_incomplete_checkpoints(base, tmp_path) -> None:
    MedusaHeads.from_base(base, num_heads=2).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(HeadCheckpointError, match="not a readable safetensors"):
        load_heads(tmp_path)
    weights.unlink()
    with pytest.raises(HeadCheckpointError, match="no model.safetensors"):
        load_heads(tmp_path)
    with pytest.raises(HeadCheckpointError, match="does not exist"):
        load_heads(tmp_path / "nowhere")


def test_unknown_head_type_and_keys(base, tmp_path) -> None:
    import json

    MedusaHeads.from_base(base, num_heads=2).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "head_type": "hydra"}))
    with pytest.raises(HeadCheckpointError, match="unknown head_type 'hydra'"):
        load_heads(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hedas": 3}))
    with pytest.raises(HeadCheckpointError, match="unknown Medusa config keys"):
        load_heads(tmp_path)


def test_bad_hyper_parameters() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        MedusaHeads.from_base(tiny_model("llama"), num_heads=0)


def test_checkpoint_files_get_the_usual_permissions(tmp_path) -> None:
    import os

    from helpers import tiny_model

    MedusaHeads.from_base(tiny_model("llama"), num_heads=1).save_pretrained(tmp_path)
    mask = os.umask(0)
    os.umask(mask)
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600
