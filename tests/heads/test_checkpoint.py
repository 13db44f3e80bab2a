"""Native checkpoint files: the one atomic writer, what loading says when config.json and the weights disagree, and
the base fingerprint's weight sample at every size."""

from __future__ import annotations

import json
import os
import platform
import random
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_model

from specheads.heads import EagleHead, HeadCheckpointError, MedusaHeads, load_heads
from specheads.heads.checkpoint import FLOAT32_EXACT_INTEGERS, atomic_write, fingerprint, sample_indices, weight_sample


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


# ------------------------------------------------------------------------------------------------ the weight sample
def _sizes() -> list[int]:
    """Element counts up to 2**24: the edges, small counts, and a seeded spread (the default base's 8192 x 208)."""
    spread = random.Random(0)
    return [0, 1, 2, 3, 31, 32, 33, 8192 * 208, FLOAT32_EXACT_INTEGERS - 1, FLOAT32_EXACT_INTEGERS] + [
        spread.randint(34, FLOAT32_EXACT_INTEGERS) for _ in range(400)
    ]


def _linspace_indices(sizes: list[int]) -> list[list[int]]:
    """The indices earlier versions sampled: float32 ``torch.linspace`` truncated to integers."""
    return [torch.linspace(0, n - 1, steps=min(32, n)).long().tolist() for n in sizes]


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="PyTorch's FMA kernels are x86 AVX2+"
)
def test_small_bases_keep_the_indices_of_float32_linspace() -> None:
    sizes = _sizes()
    assert [sample_indices(n) for n in sizes] == _linspace_indices(sizes)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86's default kernels have no FMA")
def test_fused_false_gives_the_indices_of_kernels_without_fma() -> None:
    script = (
        "import json, sys, torch; "
        "sizes = json.loads(sys.stdin.read()); "
        "print(json.dumps([torch.linspace(0, n - 1, steps=min(32, n)).long().tolist() for n in sizes]))"
    )
    environment = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    sizes = _sizes()
    result = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(sizes), capture_output=True, text=True, env=environment
    )
    assert result.returncode == 0, result.stderr
    expected = json.loads(result.stdout)
    assert [sample_indices(n, fused=False) for n in sizes] == expected
    assert any(sample_indices(n) != indices for n, indices in zip(sizes, expected, strict=True))  # the two differ


@pytest.mark.parametrize("numel", [FLOAT32_EXACT_INTEGERS + 1, 65536 * 264, 49152 * 576, 128256 * 4096])
def test_large_bases_get_indices_inside_the_weights(numel: int) -> None:
    indices = sample_indices(numel)
    assert indices[0] == 0 and indices[-1] == numel - 1 and len(indices) == 32
    assert all(a < b for a, b in zip(indices, indices[1:], strict=False))
    spacing = (numel - 1) / 31
    assert all(abs(index - i * spacing) < 1 for i, index in enumerate(indices))


class _Base(torch.nn.Module):
    """The parts of a transformers model the fingerprint reads: a config and an output embedding."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.config = SimpleNamespace(model_type="llama", num_hidden_layers=2, vocab_size=vocab, _name_or_path="")
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False).requires_grad_(False)

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.lm_head


def test_the_fingerprint_of_an_lm_head_above_2_to_the_24_elements() -> None:
    base = _Base(65536, 264)  # 17,301,504 elements: float32 rounds the last index to 17,301,504, past the end
    assert torch.linspace(0, 65536 * 264 - 1, steps=32)[-1].long() == 65536 * 264  # what used to raise
    sample = weight_sample(base)
    assert sample[0] == round(float(base.lm_head.weight[0, 0]), 6)
    assert sample[-1] == round(float(base.lm_head.weight[-1, -1]), 6)
    assert fingerprint(base) == fingerprint(base)
    with torch.no_grad():
        base.lm_head.weight[-1, -1] += 1.0
    assert weight_sample(base)[-1] != sample[-1]


def test_heads_recorded_without_fma_rounding_still_load(tmp_path) -> None:
    """A checkpoint whose sample was taken where linspace rounded twice (no FMA) is the same base's."""
    base = tiny_model("llama", seed=2, vocab_size=4547, hidden=128, layers=1)  # a size where the roundings differ
    assert weight_sample(base) != weight_sample(base, fused=False)
    MedusaHeads.from_base(base, num_heads=1).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["base_model"].update(fingerprint="0123456789abcdef", weight_sample=weight_sample(base, fused=False))
    (tmp_path / "config.json").write_text(json.dumps(config))
    load_heads(tmp_path, base_model=base)
    other = tiny_model("llama", seed=3, vocab_size=4547, hidden=128, layers=1)
    with pytest.raises(HeadCheckpointError, match="base_model.fingerprint"):
        load_heads(tmp_path, base_model=other)
