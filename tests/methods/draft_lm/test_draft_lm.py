"""The distilled draft model (head type ``draft-lm``): built from the base's own layers with its frozen vocabulary,
saved as a folder that is both a specheads checkpoint and a transformers model, lossless as a drafter, and trained
by the trainer with KL to the base (it learns: held-out agreement rises)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer
from transformers import AutoModelForCausalLM

from specheads import SpecDecoder
from specheads.heads import load_heads
from specheads.heads.checkpoint import HeadCheckpointError
from specheads.methods.draft_lm.heads import DraftLM, spaced_layers
from specheads.training.config import load_config
from specheads.training.trainer import train


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=3, layers=4, logit_scale=4.0)


def test_built_from_the_base_own_layers_with_its_vocabulary_frozen(base) -> None:
    draft = DraftLM.from_base(base, num_layers=2)
    assert draft.config.init_layers == spaced_layers(4, 2) == [0, 3]
    assert draft.model.config.num_hidden_layers == 2
    for mine, theirs in zip(draft.model.model.layers, [base.model.layers[0], base.model.layers[3]], strict=True):
        for (name, a), (_, b) in zip(mine.state_dict().items(), theirs.state_dict().items(), strict=True):
            assert torch.equal(a, b), name
    assert torch.equal(draft.model.get_input_embeddings().weight, base.get_input_embeddings().weight)
    assert torch.equal(draft.model.get_output_embeddings().weight, base.get_output_embeddings().weight)
    trainable = {n for n, p in draft.named_parameters() if p.requires_grad}
    assert trainable and not any("embed_tokens" in n or "lm_head" in n for n in trainable)
    with pytest.raises(ValueError, match="num_layers must be in 1..3"):
        DraftLM.from_base(base, num_layers=4)
    with pytest.raises(ValueError, match="distinct layers"):
        DraftLM.from_base(base, num_layers=2, init_layers=[1, 1])


def test_the_checkpoint_is_a_transformers_folder_and_decodes_losslessly(base, tmp_path) -> None:
    draft = DraftLM.from_base(base, num_layers=2)
    draft.save_pretrained(tmp_path / "draft")
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert config["head_type"] == "draft-lm" and config["model_type"] == "llama" and config["init_layers"] == [0, 3]
    ids = torch.tensor([[5, 9, 2, 31, 7]])
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "draft")  # any draft-model consumer loads it as it is
    assert torch.equal(plain(ids).logits, draft.model(ids).logits)
    loaded = load_heads(tmp_path / "draft", base)
    assert isinstance(loaded, DraftLM) and torch.equal(loaded.model(ids).logits, draft.model(ids).logits)
    reference = base.generate(ids, do_sample=False, max_new_tokens=24, attention_mask=torch.ones_like(ids))[0, 5:]
    for decoder in (
        SpecDecoder.from_pretrained(base, heads=tmp_path / "draft"),  # the registry entry's drafter
        SpecDecoder.from_pretrained(base, draft_model=tmp_path / "draft"),  # the draft-model mode, same folder
    ):
        assert decoder.generate(ids[0].tolist(), max_new_tokens=24).new_tokens == reference.tolist()
    other = tiny_model("llama", seed=4, layers=4)
    with pytest.raises(HeadCheckpointError):
        load_heads(tmp_path / "draft", other)


def test_the_trainer_distils_it(tmp_path) -> None:
    root = tmp_path
    base = tiny_model("llama", seed=1, layers=4, logit_scale=4.0)
    base.save_pretrained(root / "base")
    tiny_tokenizer().save_pretrained(root / "base")
    ids = torch.randint(2, 96, (24, 4), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    with torch.no_grad():
        rows = base.generate(
            ids, do_sample=True, max_new_tokens=40, pad_token_id=0, attention_mask=torch.ones_like(ids)
        )
    tokenizer = tiny_tokenizer()
    (root / "data.jsonl").write_text(
        "".join(json.dumps({"text": tokenizer.decode(r, skip_special_tokens=True)}) + "\n" for r in rows)
    )
    overrides = {
        "model.base": str(root / "base"), "data.paths": f"[{root / 'data.jsonl'}]", "data.format": "jsonl",
        "data.max_length": 48, "data.heldout_fraction": 0.25, "heads.type": "draft-lm", "heads.num_layers": 1,
        "train.batch_size": 6, "train.steps": 40, "train.lr": 3e-3, "train.warmup_steps": 2,
        "output.dir": str(root / "run"), "output.save_every": 20, "log.every": 10,
    }  # fmt: skip
    config = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
    untrained = DraftLM.from_base(base, num_layers=1)
    untrained.save_pretrained(root / "untrained")
    heads_dir = train(config)
    trained = json.loads((heads_dir / "eval.json").read_text())["agreement_with_base_greedy"][0]
    from specheads.methods.draft_lm.train import draft_agreement

    held_out = json.loads((heads_dir / "eval.json").read_text())
    assert held_out["positions"][0] > 0
    learned = load_heads(heads_dir, base)
    assert not torch.equal(
        learned.model.model.layers[0].mlp.up_proj.weight, untrained.model.model.layers[0].mlp.up_proj.weight
    )
    sample = rows[:, :30]
    batch = {"input_ids": sample, "attention_mask": torch.ones_like(sample), "loss_mask": torch.ones_like(sample)}
    with torch.no_grad():
        teacher = base(sample).logits.log_softmax(-1)

        def kl(draft: DraftLM) -> float:
            student = draft.model(sample).logits.log_softmax(-1)
            return float((teacher.exp() * (teacher - student)).sum(-1).mean())

    assert kl(learned) < 0.85 * kl(untrained)  # distilled towards the base (0.022 -> 0.017 here)
    before = draft_agreement(base, untrained, [batch])["agreement_with_base_greedy"][0]
    after = draft_agreement(base, learned, [batch])["agreement_with_base_greedy"][0]
    assert after > before and trained > 0.5, (before, after, trained)


def test_the_folder_drives_transformers_assisted_generation(base, tmp_path) -> None:
    draft = DraftLM.from_base(base, num_layers=2)
    draft.save_pretrained(tmp_path / "draft")
    assistant = AutoModelForCausalLM.from_pretrained(tmp_path / "draft")
    ids = torch.tensor([[5, 9, 2, 31, 7]])
    common = dict(do_sample=False, max_new_tokens=24, attention_mask=torch.ones_like(ids), pad_token_id=0)
    reference = base.generate(ids, **common)
    assisted = base.generate(ids, assistant_model=assistant, **common)
    assert torch.equal(assisted, reference)
