"""Native checkpoint files: the one atomic writer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specheads.heads.checkpoint import atomic_write


def test_atomic_write_replaces_the_file_whole_with_the_usual_permissions(tmp_path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    atomic_write(target, lambda path: path.write_text("new"))
    assert target.read_text() == "new"
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path) -> None:
    target = tmp_path / "weights.safetensors"
    target.write_text("complete")

    def half_written(path: Path) -> None:
        path.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_written)
    assert target.read_text() == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.safetensors"]  # no temporary file left behind
