"""The machine-load probe, the thread choice made from it, and the commands' busy-machine notes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from specheads import machine
from specheads.cli import _set_threads, main
from specheads.machine import LoadMeter, MachineLoad, busy_warning, choose_threads


def test_thread_choice_leaves_the_busy_cores_alone() -> None:
    quiet, half, full = MachineLoad(2, 0.1, "/proc/stat"), MachineLoad(2, 1.0, "/proc/stat"), MachineLoad(2, 2.0, "x")
    assert choose_threads(None, quiet, ceiling=2) == 2
    assert choose_threads(None, half, ceiling=2) == 1
    assert choose_threads(None, full, ceiling=2) == 1  # never 0
    assert choose_threads(None, quiet, ceiling=1) == 1  # OMP_NUM_THREADS / torch's own limit still caps it
    assert choose_threads(3, full, ceiling=2) == 3  # an explicit --threads wins


def test_busy_warning_only_when_others_use_half_a_core() -> None:
    assert busy_warning(MachineLoad(2, 0.2, "/proc/stat"), 2) is None
    note = busy_warning(MachineLoad(2, 1.0, "/proc/stat"), 1, "while the benchmark ran")
    assert note is not None and "busy while the benchmark ran" in note and "1.0 of 2 cores" in note


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
@pytest.mark.slow
def test_meter_sees_another_busy_process_but_not_its_own_work() -> None:
    baseline = machine.measure_load(0.3).busy
    meter = LoadMeter().start()
    deadline = time.monotonic() + 0.4
    while time.monotonic() < deadline:  # this process's own work is not "other processes"
        pass
    own = meter.stop().busy
    assert own < baseline + 0.5
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        other = machine.measure_load(0.5).busy
    finally:
        spinner.kill()
        spinner.wait()
    assert other >= 0.6


def test_cli_takes_only_the_idle_cores_unless_told(monkeypatch) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(machine, "measure_load", lambda seconds=0.2: MachineLoad(2, 1.2, "/proc/stat"))
        load = _set_threads(None)
        assert load.busy == 1.2 and torch.get_num_threads() == 1
        _set_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_demo_refuses_a_prompt_index_out_of_range(capsys) -> None:
    assert main(["demo", "--prompt-index", "999"]) == 2
    assert "--prompt-index must lie in [0, " in capsys.readouterr().err


def test_help_does_not_import_torch() -> None:
    code = "import sys, specheads.cli as c; c.build_parser(); import specheads; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", result.stderr


def test_train_threads_default_to_the_idle_cores_shared_among_local_processes(monkeypatch) -> None:
    from specheads import train

    before = torch.get_num_threads()
    monkeypatch.setattr(machine, "measure_load", lambda seconds=0.2: MachineLoad(4, 0.0, "/proc/stat"))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    chosen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    try:
        train._set_threads(None)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        train._set_threads(None)
        train._set_threads(3)
    finally:
        monkeypatch.undo()
    assert chosen == [4, 2, 3]
    assert torch.get_num_threads() == before
    args = train.add_arguments.__globals__["argparse"].ArgumentParser()
    train.add_arguments(args)
    assert args.parse_args(["--config", "x.yaml", "--threads", "2"]).threads == 2
