"""Native checkpoint files: the one atomic writer, and what loading says when config.json and the weights disagree."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers import tiny_model

from specheads.heads import EagleHead, HeadCheckpointError, MedusaHeads, load_heads
from specheads.heads.checkpoint import atomic_write


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=1)


def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size"])
def test_an_edited_medusa_config_names_the_tensor_the_shapes_and_the_field(base, tmp_path, field: str) -> None:
    MedusaHeads.from_base(base, num_heads=2).save_pretrained(tmp_path)
    actual = json.loads((tmp_path / "config.json").read_text())[field]
    _edit_config(tmp_path, **{field: actual + 16})
    with pytest.raises(HeadCheckpointError) as caught:
        load_heads(tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "model.safetensors") in message
    assert re.search(r"tensor '[\w.]+' has shape \[\d+(, \d+)*\]", message), message
    assert f"{field} is {actual + 16} (the weights have {actual})" in message


def test_an_edited_eagle_config_names_the_field(base, tmp_path) -> None:
    EagleHead.from_base(base, version=1).save_pretrained(tmp_path)
    actual = json.loads((tmp_path / "config.json").read_text())["intermediate_size"]
    _edit_config(tmp_path, intermediate_size=actual * 2)
    with pytest.raises(HeadCheckpointError, match=f"intermediate_size is {actual * 2} \\(the weights have {actual}\\)"):
        load_heads(tmp_path)


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
