"""Recipe v2's settings for EAGLE-3, each on a tiny model: a draft vocabulary chosen by coverage, EAGLE 3.1's norms,
Muon, warmup-stable-decay, and the training-time-test length; bad values are ConfigErrors that name their key."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from helpers import tiny_model
from training_helpers import (
    heads_state,
    make_workspace,
    rows_cache,  # noqa: F401 - autouse: a private rows cache per test
)

from specheads.heads import load_heads
from specheads.heads.vocab import draft_vocab_coverage, draft_vocab_size_for_coverage, select_draft_vocab
from specheads.methods.eagle.config import EagleHeadsConfig
from specheads.methods.eagle.train import build_heads, token_counts, train_step
from specheads.training.batches import collate_trimmed
from specheads.training.config import ConfigError, load_config
from specheads.training.data import build_dataset
from specheads.training.step import StepContext
from specheads.training.trainer import train


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("eagle-v2"), layers=4)


def _overrides(workspace: Path, out: Path, **extra) -> list[str]:
    values = {
        "model.base": str(workspace / "base"),
        "data.paths": f"[{workspace / 'data'}]",
        "data.format": "text",
        "data.max_length": 32,
        "heads.type": "eagle",
        "heads.draft_vocab_size": 48,
        "heads.ttt_steps": 3,
        "train.batch_size": 4,
        "train.steps": 6,
        "train.lr": 3e-3,
        "train.warmup_steps": 1,
        "output.dir": str(out),
        "output.save_every": 0,
        "log.every": 2,
        **extra,
    }
    return [f"{key}={value}" for key, value in values.items()]


def _dataset(workspace: Path):
    from specheads.loading import load_tokenizer

    config = load_config(None, _overrides(workspace, workspace / "unused"))
    return build_dataset(config.data, load_tokenizer(str(workspace / "base"))).with_format("torch")


# ---------------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("heads.draft_vocab_size={coverage: 0}", r"heads\.draft_vocab_size\.coverage must be in \(0, 1\]"),
        ("heads.draft_vocab_size={coverage: 1.5}", r"heads\.draft_vocab_size\.coverage"),
        ("heads.draft_vocab_size={coverage: true}", r"heads\.draft_vocab_size is"),
        ("heads.draft_vocab_size={cover: 0.9}", r"heads\.draft_vocab_size is"),
        ("heads.draft_vocab_size=0.9", r"heads\.draft_vocab_size must be an integer >= 1 or \{coverage: F\}"),
        ("heads.draft_vocab_size=0", r"heads\.draft_vocab_size must be >= 1, got 0"),
        ("heads.draft_vocab_size=many", r"heads\.draft_vocab_size must be"),
        ("heads.fc_norm=maybe", r"heads\.fc_norm must be true or false"),
        ("heads.norm_output=1", r"heads\.norm_output must be true or false"),
        ("heads.ttt_steps=0", r"heads\.ttt_steps must be >= 1"),
    ],
)
def test_bad_values_name_their_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["data.paths=[x]", "heads.type=eagle", override])


@pytest.mark.parametrize("override", ["heads.fc_norm=true", "heads.norm_output=true", "heads.norm_before_fc=true"])
def test_the_norms_are_eagle3_settings(override: str) -> None:
    with pytest.raises(ConfigError, match=r"heads\.norm_output and heads\.norm_before_fc are EAGLE-3 settings"):
        load_config(None, ["data.paths=[x]", "heads.type=eagle", "heads.version=1", override])


def test_defaults_are_todays_recipe() -> None:
    section = load_config(None, ["data.paths=[x]", "heads.type=eagle"]).heads
    assert (section.fc_norm, section.norm_output, section.norm_before_fc, section.draft_vocab_size) == (
        False,
        False,
        False,
        None,
    )
    assert section.draft_vocab_coverage is None
    coverage = load_config(None, ["data.paths=[x]", "heads.type=eagle", "heads.draft_vocab_size={coverage: 0.97}"])
    assert coverage.heads.draft_vocab_coverage == 0.97


# ---------------------------------------------------------------------------------------------------- coverage
def test_a_coverage_picks_the_smallest_vocabulary_and_says_so(workspace, capsys) -> None:
    dataset = _dataset(workspace)
    counts = token_counts(dataset, 96)
    size = draft_vocab_size_for_coverage(counts, 0.9)
    assert 1 < size < int((counts > 0).sum())  # the test data leave room to choose
    head = build_heads(tiny_model("llama", seed=1, layers=4), EagleHeadsConfig(draft_vocab_size={"coverage": 0.9}),
                       dataset)  # fmt: skip
    assert head.config.draft_vocab_size == size
    assert torch.equal(head.draft_token_ids(), select_draft_vocab(counts, size))
    covered = draft_vocab_coverage(counts, head.draft_token_ids())
    assert covered >= 0.9 > draft_vocab_coverage(counts, select_draft_vocab(counts, size - 1))
    printed = capsys.readouterr().out
    assert f"draft vocabulary: {size} of 96 ids cover {covered:.2%}" in printed and "(asked: 90.00%)" in printed


def test_a_size_is_reported_with_its_coverage(workspace, capsys) -> None:
    dataset = _dataset(workspace)
    head = build_heads(tiny_model("llama", seed=1, layers=4), EagleHeadsConfig(draft_vocab_size=20), dataset)
    covered = draft_vocab_coverage(token_counts(dataset, 96), head.draft_token_ids())
    assert f"draft vocabulary: 20 of 96 ids cover {covered:.2%}" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------- training
SETTINGS = {
    "coverage": {"heads.draft_vocab_size": "{coverage: 0.95}"},
    "norms": {"heads.fc_norm": "true", "heads.norm_output": "true"},
    "muon": {"train.optimizer": "muon"},
    "wsd": {"train.schedule": "wsd", "train.decay_fraction": 0.5},
    "ttt7": {"heads.ttt_steps": 7},
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_few_steps_with_each_setting(workspace, tmp_path, setting: str) -> None:
    extra = {"data.eval_paths": f"[{workspace / 'data'}]", "data.eval_batches": 1, **SETTINGS[setting]}
    config = load_config(None, _overrides(workspace, tmp_path / "run", **extra))
    heads_dir = train(config)
    heads = load_heads(heads_dir, base_model=tiny_model("llama", seed=1, layers=4))
    recipe = json.loads((heads_dir / "recipe.json").read_text())
    assert json.loads((tmp_path / "run" / "final_state.json").read_text())["step"] == 6
    fresh = build_heads(tiny_model("llama", seed=1, layers=4), config.heads, _dataset(workspace))
    assert replace(heads.config, base_model={}) == replace(fresh.config, base_model={})  # the recipe's architecture
    if setting == "norms":
        assert (heads.config.fc_norm, heads.config.norm_output) == (True, True)
        assert not torch.equal(heads.fc_norm[0].weight, torch.ones_like(heads.fc_norm[0].weight))  # trained
    if setting == "coverage":
        assert recipe["heads"]["draft_vocab_size"] == {"coverage": 0.95}
        assert heads.config.draft_vocab_size < 96
    assert all(torch.isfinite(value).all() for value in heads.state_dict().values())


def test_muon_resumes_exactly(workspace, tmp_path) -> None:
    """Accelerate saves and loads Muon's and AdamW's states together: 3 steps, a stop, 3 more = 6 straight steps."""
    muon = {"train.optimizer": "muon", "train.schedule": "wsd"}
    straight = train(load_config(None, _overrides(workspace, tmp_path / "straight", **muon)))
    train(load_config(None, _overrides(workspace, tmp_path / "resumed", **muon, **{"train.max_minutes": 0})))
    assert json.loads((tmp_path / "resumed" / "final_state.json").read_text())["step"] == 1  # stopped after a step
    resumed = train(load_config(None, _overrides(workspace, tmp_path / "resumed", **muon)))
    for name, value in heads_state(straight).items():
        torch.testing.assert_close(heads_state(resumed)[name], value, rtol=0, atol=1e-6)


@pytest.mark.parametrize("steps", [3, 7])
def test_the_ttt_length_is_honoured(workspace, steps: int) -> None:
    dataset = _dataset(workspace)
    base = tiny_model("llama", seed=1, layers=4)
    section = EagleHeadsConfig(draft_vocab_size=48, ttt_steps=steps)
    head = build_heads(base, section, dataset)
    batch = collate_trimmed([dataset[i] for i in range(4)])
    assert batch["input_ids"].shape[1] > steps + 2  # every step has positions to score
    context = StepContext(0, 0, 0, section, None, True, base, head, Accelerator(cpu=True))
    result = train_step(context, batch)
    step_losses = [result.metrics[f"step_{i}/loss"] for i in range(steps)]
    assert f"step_{steps}/loss" not in result.metrics and f"step_{steps - 1}/agreement" in result.metrics
    assert float(result.loss.detach()) == pytest.approx(
        sum(0.8**i * loss for i, loss in enumerate(step_losses)), rel=1e-5
    )


def test_heads_saved_before_the_norms_existed_continue(workspace, tmp_path) -> None:
    """A checkpoint whose config.json predates fc_norm / norm_output is heads without them: train.init_from takes it."""
    first = train(load_config(None, _overrides(workspace, tmp_path / "first", **{"train.steps": 1})))
    config = json.loads((first / "config.json").read_text())
    del config["fc_norm"], config["norm_output"]
    (first / "config.json").write_text(json.dumps(config))
    still = {"train.steps": 1, "train.lr": 1e-12, "train.warmup_steps": 0, "train.init_from": first}
    continued = train(load_config(None, _overrides(workspace, tmp_path / "continued", **still)))
    for name, value in heads_state(first).items():
        torch.testing.assert_close(heads_state(continued)[name], value, rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="fc_norm: False there, True here"):
        train(load_config(None, _overrides(workspace, tmp_path / "normed", **still, **{"heads.fc_norm": "true"})))
