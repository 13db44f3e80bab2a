"""A long run's freed memory goes back to the system: after a training-like pattern of allocations (tensors of 100 KB
to 16 MB freed each step, a small one kept), the process holds no more anonymous memory than before, where glibc's
default keeps hundreds of MB (the control: the measurement sees retention). The trainer applies it at the start."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PATTERN = textwrap.dedent(
    """
    import random, sys, torch
    from specheads.training.memory import return_freed_memory

    def anonymous_mb():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon"):
                return int(line.split()[1]) / 1024

    applied = return_freed_memory() if sys.argv[1] == "on" else False
    before = anonymous_mb()
    random.seed(0)
    kept = []
    for step in range(60):
        live = [torch.ones(random.randint(25_000, 4_000_000)) for _ in range(20)]
        kept.append(torch.ones(1000))
        del live
    print(applied, anonymous_mb() - before)
    """
)


def retained_mb(mode: str, **env: str) -> tuple[bool, float]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    out = subprocess.run(
        [sys.executable, "-c", PATTERN, mode], env=environment, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "True", float(out[1])


def glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


@pytest.mark.skipif(not glibc(), reason="glibc's allocator only")
def test_freed_blocks_go_back_to_the_system_where_glibc_keeps_them_by_default() -> None:
    applied, kept_with = retained_mb("on")
    _, kept_without = retained_mb("off")
    assert kept_without > 100, f"the control: glibc's default keeps {kept_without:.0f} MB (the pattern must show it)"
    assert applied and kept_with < 20, f"{kept_with:.0f} MB kept with return_freed_memory()"


@pytest.mark.skipif(not glibc(), reason="glibc's allocator only")
def test_a_threshold_set_in_the_environment_is_left_alone() -> None:
    applied, _ = retained_mb("on", MALLOC_MMAP_THRESHOLD_="131072")
    assert not applied


def test_the_trainer_applies_it_before_a_run_starts(monkeypatch) -> None:
    from specheads.training import trainer

    calls = []
    monkeypatch.setattr(trainer, "finished_run", lambda config: None)
    monkeypatch.setattr(trainer, "return_freed_memory", lambda: calls.append("memory"))

    def setup(config):
        calls.append("setup")
        raise RuntimeError("stop")

    monkeypatch.setattr(trainer, "setup", setup)
    with pytest.raises(RuntimeError, match="stop"):
        trainer.train(object())
    assert calls == ["memory", "setup"]
