"""Every registry entry is a complete method: it builds, saves and loads, decodes losslessly on four architectures,
alone and in ragged batches, and exports and checks every format it lists.

Nothing here names a method: a new entry is tested the moment it is registered.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import ARCHITECTURES, greedy_reference, tiny_model

from specheads import SpecDecoder
from specheads.export import check_export, export_heads
from specheads.heads import load_heads
from specheads.registry import HEAD_TYPES, export_formats

METHODS = sorted(HEAD_TYPES)


def _prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(2, 96, (1, length), generator=torch.Generator().manual_seed(seed))


def _greedy(base, prompt: torch.Tensor, new_tokens: int) -> list[int]:  # noqa: ANN001
    return greedy_reference(base, prompt, new_tokens)[0, prompt.shape[1] :].tolist()


def _heads(method, base, **section):  # noqa: ANN001, ANN003, ANN202
    torch.manual_seed(0)
    recipe = method.recipe_section()
    values = {k: v for k, v in section.items() if k in {f.name for f in dataclasses.fields(recipe)}}
    return method.build_heads(base, recipe(**values), None)


@pytest.mark.parametrize("name", METHODS)
def test_a_method_builds_saves_loads_and_decodes_losslessly(name: str, tmp_path) -> None:
    method = HEAD_TYPES[name]
    for arch in ARCHITECTURES:
        base = tiny_model(arch, seed=1, layers=4)
        heads = _heads(method, base)
        assert isinstance(heads, method.module_class())
        heads.save_pretrained(tmp_path / arch)
        loaded = load_heads(tmp_path / arch, base)
        assert type(loaded) is type(heads)
        for key, value in heads.state_dict().items():
            torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0, msg=f"{name} {arch} {key}")
        decoder = SpecDecoder(base, method.make_drafter(loaded))
        prompts = [_prompt(length, seed) for seed, length in enumerate((1, 6, 17))]
        for prompt in prompts:
            expected = _greedy(base, prompt, 10)
            assert decoder.generate(prompt, max_new_tokens=10).new_tokens == expected, f"{name} on {arch}"
        batch = decoder.generate([p[0] for p in prompts], max_new_tokens=10)
        for prompt, out in zip(prompts, batch, strict=True):
            assert out.new_tokens == _greedy(base, prompt, 10), f"{name} on {arch}, batched"


FOLDER_FORMATS = [
    (name, fmt) for name, method in sorted(HEAD_TYPES.items()) for fmt, spec in method.export_formats().items()
    if spec.write is not None
]  # fmt: skip


@pytest.mark.parametrize(("name", "fmt"), FOLDER_FORMATS)
def test_every_folder_format_of_a_method_exports_checks_and_reads_back(name: str, fmt: str, tmp_path) -> None:
    method = HEAD_TYPES[name]
    base = tiny_model("llama", seed=1, layers=8)  # deep enough for distinct default feature layers
    # A format may hold one version or variant of the method's heads: try the method's default, then each.
    errors = []
    for section in ({}, {"version": 3}, {"version": 1}, {"variant": "dspark"}):
        heads = _heads(method, base, **section)
        try:
            result = export_heads(heads, tmp_path / f"{fmt}-{len(errors)}", format=fmt, base_model=base)
        except ValueError as error:
            errors.append(str(error))
            continue
        break
    else:
        pytest.fail(f"no heads of {method.name} export as {fmt}: {errors}")
    assert result.report.ok, result.report.render()
    assert check_export(result.directory).format == fmt  # recognised by its own detector
    back = load_heads(result.directory, base)
    assert type(back) is type(heads)  # a format several methods write is read by the method that wrote it
    for key, value in heads.state_dict().items():
        torch.testing.assert_close(back.state_dict()[key], value, msg=f"{name} {fmt} {key}")
    decoder = SpecDecoder(base, method.make_drafter(back))
    prompt = _prompt(9, seed=3)
    assert decoder.generate(prompt, max_new_tokens=8).new_tokens == _greedy(base, prompt, 8)


def test_every_listed_format_has_its_spec_and_every_layout_its_method() -> None:
    for method in HEAD_TYPES.values():
        assert set(method.formats) == set(method.export_formats()), method.name
        assert set(method.layouts) <= set(method.formats), method.name
    assert len(export_formats()) == len(set(export_formats()))
    for fmt in export_formats():  # a format two methods write is told apart by a specific detector and a fallback
        specs = [m.export_formats()[fmt] for m in HEAD_TYPES.values() if fmt in m.formats]
        assert sum(not spec.fallback for spec in specs) >= len(specs) - 1, fmt
