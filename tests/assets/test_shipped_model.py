"""The shipped default model itself: present, verified, small, loadable offline, and lossless under the engine."""

from __future__ import annotations

import json

import pytest
import torch

from specheads import SpecDecoder, assets
from specheads.prompts import load_prompts


def test_manifest_records_what_the_issue_asks_for() -> None:
    info = assets.manifest()
    assets.verify()
    text = json.dumps(info)
    for key in ("corpus", "files", "heldout_loss", "tokens_seen", "command"):
        assert key in text, key
    total = sum((assets.DEFAULT_DIR / relative).stat().st_size for relative in info["files"])
    assert total <= 30 * 1024 * 1024


def test_the_draft_is_several_times_smaller_than_the_base() -> None:
    decoder = SpecDecoder.from_pretrained("default", draft_model="default")
    base_params = sum(p.numel() for p in decoder.model.parameters())
    draft_params = sum(p.numel() for p in decoder.drafter.model.parameters())
    assert 4 <= base_params / draft_params <= 12
    assert decoder.model.config.num_hidden_layers >= 6


def test_prompts_are_plentiful_and_well_formed() -> None:
    decoder = SpecDecoder.from_pretrained("default")
    prompts = load_prompts(assets.prompts_path(), decoder.tokenizer)
    assert len(prompts) >= 60
    assert len({p.id for p in prompts}) == len(prompts)
    lengths = [len(decoder.tokenizer(p.text)["input_ids"]) for p in prompts]
    assert max(lengths) < decoder.model.config.max_position_embeddings - 128


@pytest.mark.parametrize("method", ["draft", "prompt-lookup"])
def test_default_model_decodes_losslessly(method: str) -> None:
    kwargs = {"draft_model": "default"} if method == "draft" else {"method": method}
    decoder = SpecDecoder.from_pretrained("default", **kwargs)
    prompt = load_prompts(assets.prompts_path(), limit=1)[0].text
    out = decoder.generate(prompt, max_new_tokens=32)
    ids = torch.tensor([decoder.tokenizer(prompt)["input_ids"]])
    reference = decoder.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=32)
    assert out.new_tokens == reference[0, ids.shape[1] :].tolist()
    assert out.text == decoder.tokenizer.decode(out.new_tokens, skip_special_tokens=True)


def test_the_shipped_eagle3_heads_load_with_heads_default_and_decode_losslessly() -> None:
    from specheads.heads import EagleHead
    from specheads.methods.eagle.trees import TREES

    decoder = SpecDecoder.from_pretrained("default", heads="default")
    head = decoder.drafter.head
    assert decoder.drafter.name == "eagle" and isinstance(head, EagleHead) and head.config.version == 3
    assert head.config.draft_vocab_size < head.config.vocab_size and TREES.calibrated(head.calibration) is not None
    assert assets.manifest()["heads"]["eagle3"]["heldout_agreement_with_base_greedy_by_depth"][0] > 0.5
    files = sorted((assets.DEFAULT_DIR / "eagle3").iterdir())
    assert sum(path.stat().st_size for path in files) <= 8 * 2**20
    assert assets.manifest()["total_bytes"] <= 30 * 2**20
    prompt = torch.tensor([decoder.tokenizer("def parse(text):\n")["input_ids"]])
    out = decoder.generate(prompt, max_new_tokens=48, tree="dynamic")
    reference = decoder.model.generate(
        prompt, do_sample=False, max_new_tokens=48, attention_mask=torch.ones_like(prompt)
    )
    assert torch.equal(out.sequences, reference)
    assert out.stats.mean_accepted_length > 1.5  # trained heads: most steps accept drafts
