"""Helpers of the training tests: a workspace with a tiny base and code text, the trained heads' state, the
environment of training subprocesses, and the private rows cache every training test gets (``rows_cache``, autouse
wherever it is imported: tests/training's conftest and the methods' trainer tests)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

from specheads.heads import load_heads

TIMEOUT_S = 300  # a 2-process run must never hang the suite

TEXT = (
    "def add(a, b):\n    return a + b\n\n\nclass Stack:\n    def push(self, item):\n        self.items.append(item)\n"
)


@pytest.fixture(autouse=True)
def rows_cache(tmp_path_factory, monkeypatch):
    """Cached rows go to a fresh folder per test, not to the user's datasets cache."""
    folder = tmp_path_factory.mktemp("datasets-cache")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(folder))
    return folder


def ragged_batch(seed: int = 0, rows: int = 2, length: int = 24, padding: int = 4) -> dict[str, torch.Tensor]:
    """A training batch as the trainer's loader gives it (token ids below 96): every row after the first right-padded
    by ``padding`` positions, the first two tokens of each row no target."""
    input_ids = torch.randint(2, 96, (rows, length), generator=torch.Generator().manual_seed(seed))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1:, length - padding :] = 0
    loss_mask = attention_mask.clone()
    loss_mask[:, :2] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


def make_workspace(root: Path, layers: int = 2) -> Path:
    """``root/base`` (a tiny Llama and its tokenizer) and ``root/data`` (12 files of code text)."""
    tiny_model("llama", seed=1, layers=layers).save_pretrained(root / "base")
    tiny_tokenizer().save_pretrained(root / "base")
    data = root / "data"
    data.mkdir()
    for index in range(12):
        (data / f"doc{index:02d}.txt").write_text(TEXT * (2 + index % 3))
    return root


def medusa_overrides(workspace: Path, out: Path, **extra) -> list[str]:
    """Recipe overrides of a short Medusa run on ``workspace`` (:func:`make_workspace`) into ``out``; ``extra`` wins."""
    values = {
        "model.base": str(workspace / "base"),
        "data.paths": f"[{workspace / 'data'}]",
        "data.format": "text",
        "data.max_length": 32,
        "heads.type": "medusa",
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


def heads_state(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of the heads saved at ``path``."""
    return load_heads(path).state_dict()


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a training subprocess: offline, one thread, no tokenizer threads."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, read from /proc (empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group and every process below it.

    The group alone is not enough: torchrun starts each worker in a session of its own, so a worker stuck at exit
    outlives its killed launcher (and would keep a pipe open forever: output goes to a file, never a pipe).
    """
    below = descendants(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def run_logged(command: list[str], log: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``command`` (output into ``log``); past ``timeout`` kill it with all its processes and fail."""
    with log.open("w") as output:
        process = subprocess.Popen(
            command, env=subprocess_env(), stdout=output, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(process)
            pytest.fail(f"{' '.join(command[:6])} ... ran past {timeout} s and was killed:\n{log.read_text()[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, log.read_text(), "")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now: a launch's rendezvous port. accelerate's default (29500) is shared by every
    launch on the machine, so two 2-process tests running at once (``pytest -n 2``) would collide on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_processes(overrides: list[str], log: Path, config_file: Path | None = None) -> subprocess.CompletedProcess:
    """``accelerate launch`` two CPU processes (gloo) of ``specheads.train``, exactly as the Medusa test does (on a
    free port of their own)."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch"]
    if config_file is not None:
        launcher += ["--config_file", str(config_file)]
    else:
        launcher += ["--multi_gpu"]
    launcher += ["--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launcher += ["--main_process_port", str(free_port())]
    return run_logged([*launcher, "-m", "specheads.train", *overrides], log)


def kill_after_checkpoint_and_resume(command: list[str], out: Path, logs: Path, step: int = 8):  # noqa: ANN201
    """Run ``command`` (a training run writing to ``out``), SIGKILL it right after its step-``step`` checkpoint,
    mid-run, then run it again to the end; returns the resumed run (logs in ``logs``)."""
    import time

    with (logs / "killed.log").open("w") as output:
        process = subprocess.Popen(command, env=subprocess_env(), stdout=output, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 120
            while not (out / "checkpoints" / f"step-{step:08d}").is_dir():
                assert process.poll() is None, (logs / "killed.log").read_text()[-3000:]
                assert time.time() < deadline, f"no checkpoint at step {step} within 120 s"
                time.sleep(0.02)
        finally:
            process.send_signal(signal.SIGKILL)  # no handler runs
            process.wait()
    assert not (out / "heads").exists(), "the run finished before it could be killed; make it longer"
    return run_logged(command, logs / "resumed.log")


LOSS_VOCAB = 20  # the vocabulary of the hand-checked loss tests
LOSS_TOKENS = torch.tensor([[10, 11, 12, 13, 14, 15]])  # [1, 6]


def one_hot_logits(targets_by_position: list[int | None], length: int = 6) -> torch.Tensor:
    """``[1, length, LOSS_VOCAB]`` logits certain of each position's token (None: of none in particular)."""
    logits = torch.full((1, length, LOSS_VOCAB), -10.0)
    for position, token in enumerate(targets_by_position):
        if token is not None:
            logits[0, position, token] = 10.0
    return logits
