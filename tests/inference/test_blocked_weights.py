"""The switch's layers over oneDNN's blocked copy of their weights give every row the plain product's bits.

On a CPU with AMX, ``batch_invariant`` computes a bf16 layer over a copy of its weight in oneDNN's blocked layout,
made once per weight (the plain product copies the weight into that layout on every call). That is only a faster way
to the same numbers: at every row count the switch computes (a lone row with a zero second row, blocks of up to 32
rows) each row has the bits the plain product gives it, including at an 8,960-wide inner size (Qwen2.5-1.5B's down
projection), where oneDNN's kernels differ by row count and by the layout's intended batch size. A weight changed
between two uses is copied again, and with autograd recording the plain product runs (the blocked one has no
derivative). The plain products the switch keeps elsewhere (CPUs without AMX, fp16, a layer with a forward of its
own) still give a row the same bits alone and among many rows on this CPU.
"""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model
from transformers.pytorch_utils import Conv1D

from specheads.inference import attention

pytestmark = pytest.mark.skipif(not attention._cpu_has_amx(), reason="the blocked copy is used on CPUs with AMX only")

SHAPES = {"576 x 1,536": (576, 1536), "1,536 x 576": (1536, 576), "8,960 x 576": (8960, 576)}  # K x N
ROW_COUNTS = (1, 2, 5, 32, 40)  # a decoding step, a small tree, a full block, a block and a remainder


def _layer(inner: int, outer: int, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(inner, outer, bias=True).to(torch.bfloat16)


def _switched(layer: torch.nn.Module, rows: torch.Tensor, blocked: bool, monkeypatch) -> dict[int, torch.Tensor]:
    """``[1, n, N]`` outputs of the switched layer for the first n rows, n in :data:`ROW_COUNTS`."""
    with monkeypatch.context() as patch:
        if not blocked:
            patch.setattr(attention, "_cpu_has_amx", lambda: False)
        with torch.inference_mode(), attention.batch_invariant(layer):
            return {count: layer(rows[:, :count]) for count in ROW_COUNTS}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_each_row_count_has_the_plain_products_bits(shape: tuple[int, int], monkeypatch) -> None:
    inner, outer = shape
    layer = _layer(inner, outer)
    rows = torch.randn(1, max(ROW_COUNTS), inner, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    plain = _switched(layer, rows, blocked=False, monkeypatch=monkeypatch)
    assert layer.weight not in attention._PACKED
    blocked = _switched(layer, rows, blocked=True, monkeypatch=monkeypatch)
    assert layer.weight in attention._PACKED  # the blocked product ran
    parted = [count for count in ROW_COUNTS if not torch.equal(blocked[count], plain[count])]
    assert parted == [], f"row counts whose outputs part from the plain product's: {parted}"


def test_a_changed_weight_is_copied_again() -> None:
    layer = _layer(576, 192)
    rows = torch.randn(1, 3, 576, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.inference_mode(), attention.batch_invariant(layer):
        before = layer(rows)
    with torch.no_grad():
        layer.weight.mul_(-1)
    with torch.inference_mode(), attention.batch_invariant(layer):
        after = layer(rows)
    with torch.inference_mode():
        assert torch.equal(after, layer(rows))  # a sign flip is exact: the bits are the plain product's
        assert not torch.equal(after, before)


def test_with_autograd_recording_the_plain_product_runs_and_gradients_flow() -> None:
    layer = _layer(576, 192)
    rows = torch.randn(1, 3, 576, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    layer(rows).float().square().sum().backward()
    expected = layer.weight.grad.clone()
    layer.weight.grad = None
    with attention.batch_invariant(layer):
        layer(rows).float().square().sum().backward()
    assert torch.equal(layer.weight.grad, expected)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_without_the_blocked_copy_a_row_has_the_same_bits_alone_and_among_many_rows(arch: str, monkeypatch) -> None:
    """The plain products (a ``Conv1D`` over a transposed copy of its weight), rows 1, 5, 20 or 28 at a time against
    64 at once, at SmolLM2-135M's widths."""
    monkeypatch.setattr(attention, "_cpu_has_amx", lambda: False)
    model = tiny_model(arch, vocab_size=4096, hidden=576, layers=1, intermediate=1536).to(torch.bfloat16)
    layers = {}
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)):
            layers.setdefault(tuple(module.weight.shape), module)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode(), attention.batch_invariant(model):
        for shape, layer in layers.items():
            width = layer.in_features if isinstance(layer, torch.nn.Linear) else shape[0]
            rows = torch.randn(1, 64, width, generator=generator).to(torch.bfloat16)  # [B, T, K]
            many = layer(rows)[0]
            for size in (1, 5, 20, 28):
                fewer = torch.cat([layer(rows[:, start : start + size])[0] for start in range(0, 64, size)])
                assert torch.equal(fewer, many), (arch, shape, f"rows computed {size} at a time vs 64")
    assert not any(layer.weight in attention._PACKED for layer in layers.values())
