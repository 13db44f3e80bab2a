"""Training end to end on a tiny model: it learns, resumes after SIGKILL exactly, and runs on two processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

from specheads.heads import load_heads
from specheads.training.config import ConfigError, load_config
from specheads.training.trainer import train

TEXT = (
    "def add(a, b):\n    return a + b\n\n\nclass Stack:\n    def push(self, item):\n        self.items.append(item)\n"
)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train")
    tiny_model("llama", seed=1).save_pretrained(root / "base")
    tiny_tokenizer().save_pretrained(root / "base")
    data = root / "data"
    data.mkdir()
    for index in range(12):
        (data / f"doc{index:02d}.txt").write_text(TEXT * (2 + index % 3))
    return root


def _overrides(workspace: Path, out: Path, **extra) -> list[str]:
    values = {
        "model.base": str(workspace / "base"),
        "data.paths": f"[{workspace / 'data'}]",
        "data.format": "text",
        "data.max_length": 32,
        "heads.num_heads": 2,
        "train.batch_size": 4,
        "train.steps": 12,
        "train.lr": 5e-3,
        "train.warmup_steps": 2,
        "output.dir": str(out),
        "output.save_every": 4,
        "log.every": 2,
        **extra,
    }
    return [f"{key}={value}" for key, value in values.items()]


def _heads(path: Path) -> dict[str, torch.Tensor]:
    return load_heads(path).state_dict()


def test_medusa1_training_learns_and_exports(workspace, tmp_path) -> None:
    config = load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 30}))
    heads_dir = train(config)
    heads = load_heads(heads_dir, base_model=tiny_model("llama", seed=1))
    assert heads.config.num_heads == 2
    assert json.loads((heads_dir / "recipe.json").read_text())["train"]["steps"] == 30
    fresh = load_heads(heads_dir).state_dict()
    assert any(not torch.all(value == 0) for name, value in fresh.items() if "blocks" in name)  # blocks moved
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step-00000024", "step-00000028"]  # keep_last=2, saved every 4 steps


def test_same_seed_same_heads(workspace, tmp_path) -> None:
    first = train(load_config(None, _overrides(workspace, tmp_path / "a")))
    second = train(load_config(None, _overrides(workspace, tmp_path / "b")))
    for name, value in _heads(first).items():
        torch.testing.assert_close(value, _heads(second)[name], rtol=0, atol=0)


def test_an_output_dir_holding_another_run_is_refused(workspace, tmp_path) -> None:
    train(load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 4})))
    with pytest.raises(ConfigError, match="holds a different run"):
        train(load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 4, "train.lr": 1e-4})))
    train(
        load_config(
            None,
            _overrides(workspace, tmp_path / "run", **{"train.steps": 4, "train.lr": 1e-4, "train.overwrite": "true"}),
        )
    )


def test_missing_data_is_a_clear_error(workspace, tmp_path) -> None:
    with pytest.raises(ValueError, match="nowhere"):
        train(load_config(None, _overrides(workspace, tmp_path / "run", **{"data.paths": "[/nowhere/data.txt]"})))


def _launch(args: list[str], env_extra: dict | None = None) -> subprocess.Popen:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **(env_extra or {}),
    }
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_resume_after_sigkill_matches_an_uninterrupted_run(workspace, tmp_path) -> None:
    steps = {"train.steps": 40, "output.save_every": 5}
    reference = train(load_config(None, _overrides(workspace, tmp_path / "reference", **steps)))
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "specheads.train", *_overrides(workspace, out, **steps)]
    process = _launch(command)
    deadline = time.time() + 120
    while not (out / "checkpoints" / "step-00000010").is_dir():
        assert process.poll() is None, process.stdout.read()
        assert time.time() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "heads").exists(), "the run finished before it could be killed; make it longer"
    resumed = subprocess.run(
        command,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout + resumed.stderr
    for name, value in _heads(reference).items():
        torch.testing.assert_close(_heads(out / "heads")[name], value, rtol=0, atol=1e-6)


def test_two_processes_agree_with_one(workspace, tmp_path) -> None:
    common = {"train.steps": 8, "output.save_every": 0}
    single = train(load_config(None, _overrides(workspace, tmp_path / "single", **common)))
    out = tmp_path / "double"
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "specheads.train",
        *_overrides(workspace, out, **{**common, "train.batch_size": 2}),
    ]
    result = subprocess.run(
        command,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    final = json.loads((out / "final_state.json").read_text())
    assert final["world_size"] == 2
    first, second = final["heads_checksum_by_rank"]
    assert first == second
    for name, value in _heads(single).items():
        torch.testing.assert_close(_heads(out / "heads")[name], value, rtol=1e-4, atol=1e-5)


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


def test_heldout_evaluation_reports_agreement_per_head(workspace, tmp_path) -> None:
    extra = {"train.steps": 10, "data.eval_paths": f"[{workspace / 'data'}]", "data.eval_batches": 2}
    heads_dir = train(load_config(None, _overrides(workspace, tmp_path / "eval", **extra)))
    evaluation = json.loads((heads_dir / "eval.json").read_text())
    assert len(evaluation["agreement_with_base_greedy"]) == 2
    assert all(0.0 <= value <= 1.0 for value in evaluation["agreement_with_base_greedy"])
    assert evaluation["positions"][0] > evaluation["positions"][1] > 0


def test_head_agreement_by_hand() -> None:
    """Heads that copy the base's own next-token logits one step late agree perfectly by construction."""
    from specheads.training.evaluate import head_agreement

    base = tiny_model("llama", seed=3)
    ids = torch.randint(2, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = base(ids).logits  # [B, T, V]

    class ShiftedHeads(torch.nn.Module):
        """Head 0 at position t returns the base's logits at t + 1: the base's own choice for token t + 2."""

        def __init__(self) -> None:
            super().__init__()
            self.dummy = torch.nn.Parameter(torch.zeros(1))

        def forward(self, hidden):
            shifted = torch.cat([logits[:, 1:], logits[:, -1:]], dim=1)
            return shifted[None]

    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    result = head_agreement(base, ShiftedHeads(), [batch])
    assert result["agreement_with_base_greedy"] == [1.0]
    assert result["positions"] == [2 * 10]
