"""Medusa-2 training end to end on a tiny model: LoRA adapters trained jointly with the heads after a heads-only
stage, exported beside the heads and merged into the base by decoding, and self-distillation against the
adapter-free base; all of it through the trainer's joint-training hooks (specheads/methods/medusa/joint.py), whose
stage one steps exactly as heads trained alone. The trainer's own behaviour (resume, signals, two processes) is
tested with Medusa-1 in tests/training/test_trainer.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer
from training_helpers import (
    make_workspace,
    medusa_overrides,
    rows_cache,  # noqa: F401 - autouse: a private rows cache per test
)

from specheads.training.config import ConfigError, TrainConfig, load_config
from specheads.training.trainer import train

_overrides = medusa_overrides


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("medusa2"))


@pytest.fixture
def step_losses(monkeypatch) -> list[float]:
    """The loss of every micro-batch the trainer steps on during the test, in order (a test clears it between runs)."""
    from specheads.training import trainer

    losses: list[float] = []
    train_batch = trainer.train_batch

    def recorded(run: trainer.Run, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        metrics = train_batch(run, batch)
        losses.append(metrics["loss"])
        return metrics

    monkeypatch.setattr(trainer, "train_batch", recorded)
    return losses


def test_medusa2_lora_exports_an_adapter_that_decoding_merges(workspace, tmp_path) -> None:
    from specheads import SpecDecoder

    extra = {
        "lora.enabled": "true",
        "lora.r": 4,
        "lora.alpha": 8,
        "lora.stage1_steps": 3,
        "lora.head_weight_warmup_steps": 2,
        "train.steps": 8,
        "train.lr": 1e-2,
    }
    heads_dir = train(load_config(None, _overrides(workspace, tmp_path / "m2", **extra)))
    assert (heads_dir / "adapter" / "adapter_config.json").is_file()
    base = tiny_model("llama", seed=1)
    decoder = SpecDecoder.from_pretrained(base, heads=str(heads_dir), tokenizer=tiny_tokenizer())
    merged = decoder.model
    original = tiny_model("llama", seed=1)
    changed = any(
        not torch.equal(a, b) for a, b in zip(merged.state_dict().values(), original.state_dict().values(), strict=True)
    )
    assert changed, "the LoRA adapter should have been merged into the base"
    prompt = torch.tensor([[5, 6, 7, 8, 9]])
    reference = merged.generate(
        prompt, do_sample=False, max_new_tokens=16, pad_token_id=0, attention_mask=torch.ones_like(prompt)
    )
    assert torch.equal(decoder.generate(prompt, max_new_tokens=16).sequences, reference)


def test_medusa2_self_distillation_runs_and_reports_the_base_loss(workspace, tmp_path) -> None:
    extra = {
        "lora.enabled": "true",
        "lora.r": 4,
        "lora.self_distillation": "true",
        "train.steps": 4,
        "data.eval_paths": f"[{workspace / 'data'}]",
        "data.eval_batches": 2,
    }
    heads_dir = train(load_config(None, _overrides(workspace, tmp_path / "sd", **extra)))
    assert (heads_dir / "model.safetensors").is_file()
    evaluation = json.loads((heads_dir / "eval.json").read_text())
    assert evaluation["base_heldout_loss_original"] > 0
    assert evaluation["base_heldout_loss_fine_tuned"] > 0
    # the adapter moved the base, and "original" is the base without it
    assert evaluation["base_heldout_loss_original"] != evaluation["base_heldout_loss_fine_tuned"]


def test_medusa2_stage_one_trains_the_heads_alone_then_the_adapter_moves(workspace, tmp_path) -> None:
    from safetensors.torch import load_file

    def adapter_b(steps: int) -> list[torch.Tensor]:
        extra = {"lora.enabled": "true", "lora.r": 4, "lora.stage1_steps": 3, "train.steps": steps, "train.lr": 1e-2}
        heads_dir = train(load_config(None, _overrides(workspace, tmp_path / f"stage-{steps}", **extra)))
        weights = load_file(str(heads_dir / "adapter" / "adapter_model.safetensors"))
        return [value for name, value in weights.items() if "lora_B" in name]

    during = adapter_b(3)  # every step in stage one: LoRA's B starts at zero and must stay there
    assert during and all(torch.count_nonzero(value) == 0 for value in during)
    after = adapter_b(6)
    assert any(torch.count_nonzero(value) > 0 for value in after)


def test_medusa2_self_distillation_targets_the_adapter_free_base(workspace, tmp_path, monkeypatch) -> None:
    from specheads.methods.medusa import train as medusa_train

    seen = []
    base_loss, distillation = medusa_train._base_loss, medusa_train.distillation_loss

    def spy_base_loss(run, logits, input_ids, attention, loss_mask):  # noqa: ANN001, ANN202
        seen.append({"input_ids": input_ids.clone(), "attention": attention.clone(), "student": logits.detach()})
        return base_loss(run, logits, input_ids, attention, loss_mask)

    def spy_distillation(logits, teacher, loss_mask):  # noqa: ANN001, ANN202
        seen[-1]["teacher"] = teacher.detach().clone()
        return distillation(logits, teacher, loss_mask)

    monkeypatch.setattr(medusa_train, "_base_loss", spy_base_loss)
    monkeypatch.setattr(medusa_train, "distillation_loss", spy_distillation)
    monkeypatch.setattr(medusa_train, "lm_loss", lambda *a, **k: pytest.fail("self-distillation uses no data loss"))
    extra = {"lora.enabled": "true", "lora.r": 4, "lora.self_distillation": "true", "train.steps": 4, "train.lr": 0.05}
    train(load_config(None, _overrides(workspace, tmp_path / "sd-target", **extra)))
    assert len(seen) == 4 and all("teacher" in step for step in seen)
    last = seen[-1]
    assert not torch.allclose(last["student"], last["teacher"], atol=1e-4)  # the adapter moved the student ...
    fresh = tiny_model("llama", seed=1)  # ... and the teacher is the base as it was, without the adapter
    with torch.no_grad():
        expected = fresh(input_ids=last["input_ids"], attention_mask=last["attention"]).logits
    torch.testing.assert_close(last["teacher"], expected, atol=1e-5, rtol=1e-5)


def test_stage_one_of_joint_training_steps_bit_for_bit_as_the_heads_alone(workspace, tmp_path, step_losses) -> None:
    """Through the joint-training hooks (LoRA adapters added to the base, the heads at train.lr x
    heads_lr_multiplier, no gradient into the base for lora.stage1_steps), stage one's losses are exactly those of
    Medusa-1 heads trained alone at the heads' learning rate (head weights w0 = decay = 1: Medusa-1's plain sum);
    from stage two on, the base's own loss joins."""
    lr, stage_one, steps = 1e-2, 3, 5
    joint = {
        "lora.enabled": "true",
        "lora.r": 4,
        "lora.stage1_steps": stage_one,
        "lora.head_weight": 1.0,
        "lora.head_decay": 1.0,
        "train.lr": lr,
        "train.steps": steps,
    }
    train(load_config(None, _overrides(workspace, tmp_path / "joint", **joint)))
    with_base = list(step_losses)
    step_losses.clear()
    heads_lr = lr * TrainConfig().heads_lr_multiplier
    train(
        load_config(
            None, _overrides(workspace, tmp_path / "alone", **{"train.lr": repr(heads_lr), "train.steps": steps})
        )
    )
    alone = list(step_losses)
    assert len(with_base) == len(alone) == steps
    assert [value.hex() for value in with_base[:stage_one]] == [value.hex() for value in alone[:stage_one]]
    assert with_base[stage_one] != alone[stage_one]


def test_joint_training_refuses_a_feature_cache_by_its_setting(workspace, tmp_path) -> None:
    cache = tmp_path / "features"
    extra = {"lora.enabled": "true", "lora.r": 4, "data.feature_cache": str(cache)}
    with pytest.raises(ConfigError, match=r"^data\.feature_cache needs a frozen base; lora\.enabled trains it$"):
        train(load_config(None, _overrides(workspace, tmp_path / "cached", **extra)))
    assert not cache.exists()
