"""Gradient accumulation (``train.grad_accumulation``, which the shipped 7B/8B recipes use) on a tiny model.

The data is 20 distinct rows in micro-batches of 4: five micro-batches an epoch, so at ``grad_accumulation=2`` an
epoch is three optimizer steps: two of two micro-batches, then one of the micro-batch left over at the epoch's end,
which steps alone (Accelerate syncs at the end of the data loader). The tests watch the real optimizer (a step
pre-hook on the torch optimizer) and the rows of every micro-batch (a spy on ``train_batch``): a 2-epoch run sees
every row once per epoch and steps six times; each step follows the gradient of the mean loss over its
micro-batches' targets, as the trainer documents (micro-batches of 10 and 100 targets step as one batch of their 110,
for every method); a run stopped mid-run (SIGINT in process, SIGKILL in a subprocess) resumes to the same
micro-batches and the same weights as an uninterrupted one.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
import torch
from training_helpers import TEXT, heads_state, kill_after_checkpoint_and_resume, make_workspace, medusa_overrides

from specheads.training.config import load_config
from specheads.training.trainer import TrainingInterrupted, train

ROWS, BATCH, ACCUMULATION = 20, 4, 2
MICRO_BATCHES = ROWS // BATCH  # per epoch: 5, so each epoch ends with one micro-batch left over
STEPS_PER_EPOCH = -(-MICRO_BATCHES // ACCUMULATION)  # 3: two full accumulations and the left-over micro-batch


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The tiny base of :func:`make_workspace` and ``rows/``: 20 distinct documents, each one row (no packing)."""
    root = make_workspace(tmp_path_factory.mktemp("accumulation"))
    rows = root / "rows"
    rows.mkdir()
    for index in range(ROWS):
        (rows / f"row{index:02d}.txt").write_text(f"row {index}: {TEXT}")  # longer than a row: cut to 32 tokens
    return root


def _overrides(workspace: Path, out: Path, **extra) -> list[str]:
    """A Medusa run over ``rows/`` for 2 epochs at ``grad_accumulation=2``; ``extra`` wins."""
    values = {
        "data.paths": f"[{workspace / 'rows'}]",
        "data.packing": "false",
        "train.batch_size": BATCH,
        "train.grad_accumulation": ACCUMULATION,
        "train.steps": "null",
        "train.epochs": 2,
        "train.warmup_steps": 0,
        "output.save_every": 100,
        **extra,
    }
    return medusa_overrides(workspace, out, **values)


class Watch:
    """What a run does, micro-batch by micro-batch: the rows of each (their real tokens) and, per optimizer step of
    the torch optimizer itself, the index of the micro-batch it followed and the gradient it stepped with."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, own_gradients: bool = False, stop_at: int | None = None):
        from specheads.training import trainer

        self.micro_batches: list[list[tuple[int, ...]]] = []
        self.steps_after: list[int] = []  # per optimizer step: the micro-batch (0-based, in this run) it followed
        self.stepped_gradients: list[list[torch.Tensor]] = []
        self.own_gradients: list[list[torch.Tensor]] = []  # per micro-batch: the gradient of its own loss
        self.weights: list[float] = []  # per micro-batch: the targets its loss is the mean over (StepResult.weight)
        self._hooked: set[int] = set()
        original = trainer.train_batch

        def watched(run, batch):
            optimizer = run.optimizer.optimizer  # the torch optimizer under Accelerate's wrapper
            if id(optimizer) not in self._hooked:
                self._hooked.add(id(optimizer))
                optimizer.register_step_pre_hook(self._record_step)
            self.micro_batches.append(_rows(batch))
            if own_gradients:
                gradient, weight = _gradient_of_own_loss(run, batch)
                self.own_gradients.append(gradient)
                self.weights.append(weight)
            metrics = original(run, batch)
            if stop_at is not None and run.accelerator.sync_gradients and run.step + 1 == stop_at:
                signal.raise_signal(signal.SIGINT)  # the loop finishes this step, checkpoints and stops
            return metrics

        monkeypatch.setattr(trainer, "train_batch", watched)

    def _record_step(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self.steps_after.append(len(self.micro_batches) - 1)
        self.stepped_gradients.append([p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"]])


def _rows(batch: dict[str, torch.Tensor]) -> list[tuple[int, ...]]:
    """The rows of a micro-batch, each as its real (attended) token ids."""
    pairs = zip(batch["input_ids"], batch["attention_mask"], strict=True)
    return [tuple(ids[mask.bool()].tolist()) for ids, mask in pairs]


def _gradient_of_own_loss(run, batch: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], float]:
    """The gradient of this micro-batch's loss alone at the current weights (no accumulation, nothing stored), and
    the loss's weight (its targets)."""
    from specheads.training.trainer import step_context

    parameters = [p for g in run.optimizer.param_groups for p in g["params"]]
    result = run.train_step(step_context(run, log_metrics=False), batch)
    gradients = torch.autograd.grad(result.loss, parameters, allow_unused=True)
    own = [torch.zeros_like(p) if g is None else g for p, g in zip(parameters, gradients, strict=True)]
    return own, float(result.weight)


def _all_rows(workspace: Path) -> set[tuple[int, ...]]:
    """Every training row, as the trainer's data builds them."""
    from specheads.loading import load_tokenizer
    from specheads.training.data import build_dataset

    config = load_config(None, _overrides(workspace, workspace / "unused"))
    dataset = build_dataset(config.data, load_tokenizer(config.model.base)).with_format("torch")
    rows = {row for index in range(len(dataset)) for row in _rows(dataset[index : index + 1])}
    assert len(rows) == len(dataset) == ROWS
    return rows


def test_two_epochs_see_every_row_once_per_epoch_and_step_after_each_pair_and_each_epochs_end(
    workspace, tmp_path, monkeypatch
) -> None:
    watch = Watch(monkeypatch)
    train(load_config(None, _overrides(workspace, tmp_path / "run")))
    rows = _all_rows(workspace)
    assert len(watch.micro_batches) == 2 * MICRO_BATCHES
    for epoch in range(2):
        seen = [row for batch in watch.micro_batches[epoch * MICRO_BATCHES :][:MICRO_BATCHES] for row in batch]
        assert sorted(seen) == sorted(rows), f"epoch {epoch} did not see every row exactly once"
    # two micro-batches a step, and the one left over at each epoch's end steps alone
    assert watch.steps_after == [1, 3, 4, 6, 8, 9]
    final = json.loads((tmp_path / "run" / "final_state.json").read_text())
    assert final["step"] == final["total_steps"] == 2 * STEPS_PER_EPOCH


def test_a_step_follows_the_gradient_of_the_mean_over_its_micro_batches_targets(
    workspace, tmp_path, monkeypatch
) -> None:
    """What ``train_batch`` documents: a step of two micro-batches follows the gradient of the mean loss over their
    targets (each micro-batch's gradient weighed by its targets), and the micro-batch left over at an epoch's end
    steps with its own gradient."""
    watch = Watch(monkeypatch, own_gradients=True)
    steps = {"train.steps": STEPS_PER_EPOCH, "train.max_grad_norm": 1e9}  # one epoch; clipping never scales
    train(load_config(None, _overrides(workspace, tmp_path / "run", **steps)))
    assert watch.steps_after == [1, 3, 4]
    assert all(weight > 0 for weight in watch.weights)
    groups = [(0, 1), (2, 3), (4,)]
    for stepped, group in zip(watch.stepped_gradients, groups, strict=True):
        weights = [watch.weights[i] for i in group]
        parts = zip(*(watch.own_gradients[i] for i in group), strict=True)
        expected = [sum(w * g for w, g in zip(weights, part, strict=True)) / sum(weights) for part in parts]
        assert any(bool(g.abs().sum() > 0) for g in expected)
        for got, want in zip(stepped, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)


def test_a_run_stopped_mid_epoch_resumes_to_the_same_micro_batches_and_weights(
    workspace, tmp_path, monkeypatch
) -> None:
    """Stopped at step 4 (after epoch 0's three steps and one of epoch 1's: 7 micro-batches, not 4 x 2)."""
    with monkeypatch.context() as patch:
        reference_watch = Watch(patch)
        reference = train(load_config(None, _overrides(workspace, tmp_path / "reference")))
    config = load_config(None, _overrides(workspace, tmp_path / "run"))
    with monkeypatch.context() as patch:
        stopped = Watch(patch, stop_at=STEPS_PER_EPOCH + 1)
        with pytest.raises(TrainingInterrupted, match="at step 4"):
            train(config)
    with monkeypatch.context() as patch:
        resumed = Watch(patch)
        heads = train(config)
    assert stopped.micro_batches + resumed.micro_batches == reference_watch.micro_batches
    assert len(stopped.micro_batches) == MICRO_BATCHES + 2
    for name, value in heads_state(reference).items():
        torch.testing.assert_close(heads_state(heads)[name], value, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_resume_after_sigkill_at_grad_accumulation_2_matches_an_uninterrupted_run(workspace, tmp_path) -> None:
    """Killed right after the step-8 checkpoint (14 micro-batches in: mid third epoch), run again to the end."""
    length = {"train.epochs": 12, "output.save_every": 2}  # 36 steps: long enough to be killed mid-run
    reference = train(load_config(None, _overrides(workspace, tmp_path / "reference", **length)))
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "specheads.train", *_overrides(workspace, out, **length)]
    resumed = kill_after_checkpoint_and_resume(command, out, tmp_path, step=8)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resumed from" in resumed.stdout
    for name, value in heads_state(reference).items():
        torch.testing.assert_close(heads_state(out / "heads")[name], value, rtol=0, atol=1e-6)
    seen = [json.loads((run / "final_state.json").read_text()) for run in (reference.parent, out)]
    assert seen[0]["step"] == seen[1]["step"] == 12 * STEPS_PER_EPOCH
    assert seen[0]["tokens_seen"] == seen[1]["tokens_seen"] == 12 * ROWS * 32  # every row once an epoch


# ------------------------------------------------------------------------------------------ targets, not micro-batches
def _targets_batch(targets: int, seed: int, rows: int = 4, length: int = 40) -> dict[str, torch.Tensor]:
    """Full rows whose loss mask holds ``targets`` ones, at random positions from 2 on (so that every method, whose
    first target is token t + 1 or t + 2, counts all of them)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(2, 96, (rows, length), generator=generator)
    chosen = torch.zeros(rows * (length - 2), dtype=torch.long)
    chosen[torch.randperm(chosen.numel(), generator=generator)[:targets]] = 1
    loss_mask = torch.cat([torch.zeros(rows, 2, dtype=torch.long), chosen.view(rows, length - 2)], dim=1)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "loss_mask": loss_mask}


def _accumulating_run(name: str, tmp_path: Path, **section):  # noqa: ANN202
    """A trainer ``Run`` of method ``name`` at ``grad_accumulation=2`` over in-memory parts (one CPU process)."""
    import datasets
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from helpers import tiny_model
    from transformers import get_scheduler

    from specheads.registry import HEAD_TYPES
    from specheads.training.config import RecipeConfig, TrainConfig
    from specheads.training.run_state import Run

    method = HEAD_TYPES[name]
    base = tiny_model("llama", seed=1, layers=4, logit_scale=4.0).requires_grad_(False)
    rows = _targets_batch(64, seed=9)
    dataset = datasets.Dataset.from_dict({key: value.tolist() for key, value in rows.items()}).with_format("torch")
    torch.manual_seed(0)
    heads = method.build_heads(base, method.recipe_section()(**section), dataset)
    train_config = TrainConfig(steps=1, grad_accumulation=2, max_grad_norm=1e9, schedule="constant")
    config = RecipeConfig(heads=method.recipe_section()(**section), train=train_config)
    AcceleratorState._reset_state(reset_partial_state=False)
    accelerator = Accelerator(cpu=True, mixed_precision="no", gradient_accumulation_steps=2)
    optimizer = torch.optim.SGD([p for p in heads.parameters() if p.requires_grad], lr=0.0)
    heads, optimizer = accelerator.prepare(heads, optimizer)
    scheduler = get_scheduler("constant", optimizer)
    return Run(config, accelerator, base, heads, optimizer, scheduler, None, 1, 2, tmp_path, method)


@pytest.mark.parametrize(
    ("name", "section", "mean_over_targets"),
    [
        ("medusa", {"num_heads": 1}, True),
        ("eagle", {"ttt_steps": 1}, True),
        ("draft-lm", {"num_layers": 1}, True),
        ("dflash", {"num_anchors": 4}, False),  # its loss is divided by its blocks: a micro-batch weighs its rows
    ],
    ids=["medusa", "eagle", "draft-lm", "dflash"],
)
def test_micro_batches_of_10_and_100_targets_step_with_the_gradient_of_their_110(
    name: str, section: dict, mean_over_targets: bool, tmp_path
) -> None:
    """Two micro-batches of 4 rows, one with 10 targets and one with 100, make the step of one batch of their 8 rows:
    every method's loss is weighed by what it averages over, not micro-batch by micro-batch."""
    from specheads.training.trainer import step_context, train_batch

    run = _accumulating_run(name, tmp_path, **section)
    short, long = _targets_batch(10, seed=0), _targets_batch(100, seed=1)
    assert int(short["loss_mask"].sum()) == 10 and int(long["loss_mask"].sum()) == 100
    both = {key: torch.cat([short[key], long[key]]) for key in short}
    parameters = [p for g in run.optimizer.param_groups for p in g["params"]]

    def gradient(batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        loss = run.train_step(step_context(run, log_metrics=False), batch).loss
        grads = torch.autograd.grad(loss, parameters, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for p, g in zip(parameters, grads, strict=True)]

    expected = gradient(both)
    stepped: list[list[torch.Tensor]] = []

    def record(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        stepped.append([p.grad.clone() for p in parameters])

    run.optimizer.optimizer.register_step_pre_hook(record)
    for batch in (short, long):
        with run.accelerator.accumulate(run.heads):
            train_batch(run, batch)
    assert len(stepped) == 1, "the two micro-batches make one optimizer step"
    assert any(bool(g.abs().sum() > 0) for g in expected)
    for got, want in zip(stepped[0], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    # The rule the test tells apart: the mean of the two micro-batches' own gradients is another gradient.
    mean = [(a + b) / 2 for a, b in zip(gradient(short), gradient(long), strict=True)]
    distance = sum(float((m - e).norm()) for m, e in zip(mean, expected, strict=True))
    size = sum(float(e.norm()) for e in expected)
    assert (distance > 0.05 * size) == mean_over_targets
