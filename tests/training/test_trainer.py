"""Training end to end on a tiny model: it learns, resumes after SIGKILL exactly, and runs on two processes (with
Medusa-1 heads; Medusa-2's joint training is tested with Medusa, tests/methods/medusa/)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import tiny_model
from training_helpers import free_port, heads_state, make_workspace, medusa_overrides, subprocess_env

from specheads.heads import load_heads
from specheads.heads.checkpoint import atomic_write
from specheads.training.config import ConfigError, load_config
from specheads.training.trainer import TrainingInterrupted, train


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("train"))


_overrides = medusa_overrides
_heads = heads_state


def test_medusa1_training_learns_and_exports(workspace, tmp_path) -> None:
    config = load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 30}))
    heads_dir = train(config)
    heads = load_heads(heads_dir, base_model=tiny_model("llama", seed=1))
    assert heads.config.num_heads == 2
    assert json.loads((heads_dir / "recipe.json").read_text())["train"]["steps"] == 30
    fresh = load_heads(heads_dir).state_dict()
    assert any(not torch.all(value == 0) for name, value in fresh.items() if "blocks" in name)  # blocks moved
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step-00000028", "step-00000030"]  # keep_last=2, saved every 4 steps and at the last


def test_the_last_step_always_checkpoints(workspace, tmp_path) -> None:
    train(load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 6, "output.save_every": 100})))
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-00000006"]


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


def test_a_run_that_failed_before_its_first_checkpoint_does_not_block_its_directory(workspace, tmp_path) -> None:
    with pytest.raises(ValueError, match="nowhere"):
        train(load_config(None, _overrides(workspace, tmp_path / "run", **{"data.paths": "[/nowhere/data.txt]"})))
    heads_dir = train(load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 2})))
    assert (heads_dir / "model.safetensors").is_file()


def _files(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def test_rerunning_a_finished_run_changes_nothing(workspace, tmp_path, capsys) -> None:
    from specheads.cli import main
    from specheads.train import main as train_entry_point

    args = _overrides(workspace, tmp_path / "run", **{"train.steps": 6, "output.save_every": 100})
    heads_dir = train(load_config(None, args))
    before = _files(tmp_path / "run")
    capsys.readouterr()
    for entry_point in (lambda: main(["train", *args]), lambda: train_entry_point(args)):  # CLI, accelerate launch
        assert entry_point() == 0
        out = capsys.readouterr().out.strip().splitlines()
        assert len(out) == 1 and "complete" in out[0] and str(heads_dir) in out[0], out
    assert train(load_config(None, args)) == heads_dir
    assert _files(tmp_path / "run") == before


def test_raising_train_steps_continues_a_finished_run(workspace, tmp_path, capsys) -> None:
    train(load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 6, "output.save_every": 100})))
    capsys.readouterr()
    longer = _overrides(workspace, tmp_path / "run", **{"train.steps": 10, "output.save_every": 100})
    train(load_config(None, longer))
    assert "resumed from" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "final_state.json").read_text())["step"] == 10
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-00000006", "step-00000010"]
    with pytest.raises(ConfigError, match="already trained 10 steps, more than train.steps=6"):
        train(load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 6})))


def test_a_run_recorded_before_a_setting_existed_still_continues(workspace, tmp_path, capsys) -> None:
    train(load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 4, "output.save_every": 100})))
    recorded = tmp_path / "run" / "run_config.json"
    older = json.loads(recorded.read_text())
    del older["data"]["group_by_length"]  # as written by a version without the setting: read at its default
    recorded.write_text(json.dumps(older))
    capsys.readouterr()
    train(load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 6, "output.save_every": 100})))
    assert "resumed from" in capsys.readouterr().out
    older["data"]["packing"] = not older["data"]["packing"]  # a recorded setting that differs is another run
    recorded.write_text(json.dumps(older))
    with pytest.raises(ConfigError, match="holds a different run"):
        train(load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 8})))


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_a_tracker_whose_package_is_missing_is_refused_before_training(
    workspace, tmp_path, monkeypatch, tracker: str
) -> None:
    import accelerate.utils

    monkeypatch.setattr(accelerate.utils, f"is_{tracker}_available", lambda: False)
    config = load_config(None, _overrides(workspace, tmp_path / "run", **{"log.tracker": tracker}))
    with pytest.raises(
        ConfigError, match=f"log.tracker '{tracker}' needs the {tracker} package: pip install {tracker}"
    ):
        train(config)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_trainer_writes_its_files_through_the_atomic_writer(workspace, tmp_path, monkeypatch) -> None:
    from specheads.training import heldout, run_state

    written = []

    def recording(target, write) -> None:
        written.append(Path(target).name)
        atomic_write(target, write)

    for module in (run_state, heldout):  # the trainer's modules that write files (run_state: every JSON file)
        monkeypatch.setattr(module, "atomic_write", recording)
    extra = {"train.steps": 2, "data.eval_paths": f"[{workspace / 'data'}]", "data.eval_batches": 1}
    train(load_config(None, _overrides(workspace, tmp_path / "run", **extra)))
    expected = {"run_config.json", "trainer_state.json", "recipe.json", "eval.json", "final_state.json"}
    assert set(written) == expected


def _signal_during_step(monkeypatch, step: int, number: int, times: int = 1) -> None:
    """Deliver ``number`` to this process ``times`` times while optimizer step ``step`` runs."""
    from specheads.training import trainer

    original = trainer.train_batch

    def batch_then_signal(run, batch):
        metrics = original(run, batch)
        if run.step + 1 == step:
            for _ in range(times):
                signal.raise_signal(number)
        return metrics

    monkeypatch.setattr(trainer, "train_batch", batch_then_signal)


@pytest.mark.parametrize(("number", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.slow
def test_a_signal_finishes_the_step_checkpoints_and_resumes(
    workspace, tmp_path, monkeypatch, number, exit_code
) -> None:
    steps = {"train.steps": 8, "output.save_every": 100}
    reference = train(load_config(None, _overrides(workspace, tmp_path / "reference", **steps)))
    config = load_config(None, _overrides(workspace, tmp_path / "run", **steps))
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as patch:
        _signal_during_step(patch, 3, number)
        with pytest.raises(TrainingInterrupted) as caught:
            train(config)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000003"
    assert caught.value.exit_code == exit_code and caught.value.checkpoint == checkpoint
    assert str(caught.value) == (
        f"interrupted by {signal.Signals(number).name} at step 3; checkpoint saved to {checkpoint}; "
        "run the same command again to resume"
    )
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["step-00000003"]
    assert not (tmp_path / "run" / "heads").exists()
    resumed = train(config)
    for name, value in _heads(reference).items():
        torch.testing.assert_close(_heads(resumed)[name], value, rtol=0, atol=1e-6)


def test_a_signal_repeated_by_a_launcher_still_checkpoints(workspace, tmp_path, monkeypatch) -> None:
    """accelerate launch / torchrun forward the terminal's Ctrl-C to ranks that already received it."""
    config = load_config(None, _overrides(workspace, tmp_path / "run", **{"output.save_every": 100}))
    with monkeypatch.context() as patch:
        _signal_during_step(patch, 2, signal.SIGINT, times=2)
        with pytest.raises(TrainingInterrupted, match="at step 2; checkpoint saved"):
            train(config)
    assert (tmp_path / "run" / "checkpoints" / "step-00000002" / "trainer_state.json").is_file()


def test_an_interrupted_extension_of_a_finished_run_still_resumes(workspace, tmp_path, monkeypatch) -> None:
    train(load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 4, "output.save_every": 100})))
    longer = load_config(None, _overrides(workspace, tmp_path / "run", **{"train.steps": 8, "output.save_every": 100}))
    with monkeypatch.context() as patch:
        _signal_during_step(patch, 6, signal.SIGINT)
        with pytest.raises(TrainingInterrupted):
            train(longer)
    train(longer)
    assert json.loads((tmp_path / "run" / "final_state.json").read_text())["step"] == 8


def _env(env_extra: dict | None = None) -> dict:
    return subprocess_env(**(env_extra or {}))


def _launch(args: list[str], env_extra: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(args, env=_env(env_extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _run(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a training command to its end (a guard against a hang, not a measurement)."""
    return subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
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
    resumed = _run(command)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout + resumed.stderr
    for name, value in _heads(reference).items():
        torch.testing.assert_close(_heads(out / "heads")[name], value, rtol=0, atol=1e-6)
    # The tokens the heads saw survive the kill: counted up to each checkpoint, restored on resume.
    seen = [json.loads((run / "final_state.json").read_text()) for run in (reference.parent, out)]
    assert seen[0]["tokens_seen"] == seen[1]["tokens_seen"] == 40 * 4 * 32  # steps x batch x packed rows of 32
    assert seen[0]["targets_seen"] == seen[1]["targets_seen"] > 0


@pytest.mark.slow
def test_ctrl_c_in_specheads_train_checkpoints_and_exits_130_without_a_traceback(workspace, tmp_path) -> None:
    out = tmp_path / "run"
    steps = {"train.steps": 40, "output.save_every": 2, "output.keep_last": 100}
    command = [sys.executable, "-m", "specheads.cli", "train", *_overrides(workspace, out, **steps)]
    process = _launch(command)
    try:
        deadline = time.time() + 120  # a guard against a hang, not a measurement
        while not (out / "checkpoints" / "step-00000002").is_dir():  # a step has happened
            assert process.poll() is None, process.stdout.read()
            assert time.time() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output
    assert "Traceback" not in output, output
    assert not (out / "heads").exists(), "the run finished before it could be interrupted; make it longer"
    message = re.fullmatch(
        r"specheads train: interrupted by SIGINT at step (\d+); checkpoint saved to (\S+); "
        r"run the same command again to resume",
        output.strip().splitlines()[-1],
    )
    assert message, output
    checkpoint = Path(message[2])
    assert checkpoint == out / "checkpoints" / f"step-{int(message[1]):08d}"
    assert (checkpoint / "trainer_state.json").is_file()
    resumed = _run(command)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {checkpoint} at step {message[1]}" in resumed.stdout
    assert json.loads((out / "final_state.json").read_text())["step"] == 40


@pytest.mark.slow
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
        "--main_process_port",
        str(free_port()),
        "-m",
        "specheads.train",
        *_overrides(workspace, out, **{**common, "train.batch_size": 2}),
    ]
    result = _run(command, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    final = json.loads((out / "final_state.json").read_text())
    assert final["world_size"] == 2
    first, second = final["heads_checksum_by_rank"]
    assert first == second
    for name, value in _heads(single).items():
        torch.testing.assert_close(_heads(out / "heads")[name], value, rtol=1e-4, atol=1e-5)


def test_heldout_evaluation_reports_agreement_per_head(workspace, tmp_path) -> None:
    extra = {"train.steps": 10, "data.eval_paths": f"[{workspace / 'data'}]", "data.eval_batches": 2}
    heads_dir = train(load_config(None, _overrides(workspace, tmp_path / "eval", **extra)))
    evaluation = json.loads((heads_dir / "eval.json").read_text())
    assert len(evaluation["agreement_with_base_greedy"]) == 2
    assert all(0.0 <= value <= 1.0 for value in evaluation["agreement_with_base_greedy"])
    assert evaluation["positions"][0] > evaluation["positions"][1] > 0


def test_head_agreement_by_hand() -> None:
    """Heads that copy the base's own next-token logits one step late agree perfectly by construction."""
    from specheads.methods.medusa.evaluate import head_agreement

    base = tiny_model("llama", seed=3)
    ids = torch.randint(2, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = base(ids).logits  # [B, T, V]

    class ShiftedHeads(torch.nn.Module):
        """Head 0 at position t returns the base's logits at t + 1: the base's own choice for token t + 2."""

        def __init__(self) -> None:
            super().__init__()
            self.dummy = torch.nn.Parameter(torch.zeros(1))

        def forward(self, hidden, readout=None):
            shifted = torch.cat([logits[:, 1:], logits[:, -1:]], dim=1)
            if readout is None:
                return shifted[None]
            identity = torch.eye(shifted.shape[-1])  # F.linear(shifted, identity) == shifted
            return [readout(0, shifted, identity, None)]

    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    result = head_agreement(base, ShiftedHeads(), [batch])
    assert result["agreement_with_base_greedy"] == [1.0]
    assert result["positions"] == [2 * 10]


def test_length_grouped_batches_hold_rows_of_similar_length_and_replay_per_epoch() -> None:
    from specheads.training.batches import LengthGroupedSampler

    lengths = [int(length) for length in torch.randint(1, 512, (1003,), generator=torch.Generator().manual_seed(0))]
    sampler = LengthGroupedSampler(lengths, batch_size=8, seed=3, group_batches=10)
    order = list(sampler)
    assert sorted(order) == list(range(len(lengths)))  # every row once
    batches = [order[i : i + 8] for i in range(0, 1000, 8)]
    assert len(order[1000:]) == 3 and all(len(batch) == 8 for batch in batches)  # the short batch stays last
    padded = sum(8 * max(lengths[i] for i in batch) for batch in batches)
    shuffled = torch.randperm(1000, generator=torch.Generator().manual_seed(1)).tolist()
    padded_random = sum(8 * max(lengths[i] for i in shuffled[k : k + 8]) for k in range(0, 1000, 8))
    real = sum(lengths[i] for i in order[:1000])
    assert real / padded > 0.9 > 0.7 > real / padded_random  # grouping spends the steps on real tokens
    assert list(sampler) == order  # the same epoch replays (a resumed run)
    sampler.set_epoch(1)
    assert list(sampler) != order
    starts = [lengths[batch[0]] for batch in batches]
    assert starts != sorted(starts, reverse=True)  # batches are shuffled, not served longest first


def test_simulated_tau_by_hand() -> None:
    from specheads.training.evaluate import simulated_tau

    by_rank = [[0.5, 0.2], [0.4, 0.1], [0.5, 0.0]]
    tau = simulated_tau(by_rank, chain=3, trees=(1, 3))
    assert tau["chain-3"] == pytest.approx(1 + 0.5 + 0.5 * 0.4 + 0.5 * 0.4 * 0.5)
    assert tau["tree-1"] == pytest.approx(1.5)
    # the greedy tree: (0) 0.5, then (0, 0) 0.2 and (1) 0.2 tie, the heap takes the shorter path's tuple first
    assert tau["tree-3"] == pytest.approx(1 + 0.5 + 0.2 + 0.2)


def test_periodic_evaluation_logs_every_n_steps_and_best_selection_exports_the_best(workspace, tmp_path) -> None:
    extra = {
        "train.steps": 12,
        "train.lr": 0.05,  # a rate high enough for held-out agreement to move between evaluations
        "data.eval_paths": f"[{workspace / 'data'}]",
        "data.eval_batches": 2,
        "log.eval_every": 4,
        "output.select": "best",
        "output.select_by": "chain-3",
    }
    heads_dir = train(load_config(None, _overrides(workspace, tmp_path / "best", **extra)))
    evals = [json.loads(line) for line in (tmp_path / "best" / "evals.jsonl").read_text().splitlines()]
    assert [record["step"] for record in evals] == [4, 8, 12]
    assert evals[0]["tokens_seen"] < evals[1]["tokens_seen"] < evals[2]["tokens_seen"]
    scores = [record["simulated_tau"]["chain-3"] for record in evals]
    assert all(score >= 1.0 for score in scores)
    evaluation = json.loads((heads_dir / "eval.json").read_text())
    best_step = evals[scores.index(max(scores))]["step"]
    assert evaluation["selected"] == {"step": best_step, "rule": "best", "by": "chain-3"}
    assert evaluation["simulated_tau"]["chain-3"] == max(scores)
    if best_step != 12:  # the exported heads are the kept ones, not the last step's
        kept = heads_state(tmp_path / "best" / "best")
        assert all(torch.equal(kept[name], value) for name, value in heads_state(heads_dir).items())


def test_best_selection_needs_heldout_data(workspace, tmp_path) -> None:
    with pytest.raises(ConfigError, match="need held-out data"):
        load_config(None, _overrides(workspace, tmp_path / "x", **{"output.select": "best"}))


@pytest.mark.slow
def test_wandb_without_an_api_key_logs_offline_where_the_run_is(workspace, tmp_path, monkeypatch) -> None:
    """The trainer's own fallback, not the test session's: WANDB_MODE and the key are unset here."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-root"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = load_config(None, _overrides(workspace, tmp_path / "run", **{"log.tracker": "wandb", "train.steps": 2}))
    train(config)
    assert os.environ["WANDB_MODE"] == "offline"
    runs = list((tmp_path / "wandb-root").rglob("offline-run-*"))
    assert runs, "no offline wandb run was written"
