"""The toy method's export formats: ``toy``, a folder (config + ``toy.safetensors``) that an imaginary engine reads,
and ``toy-file``, the same in one safetensors file (``.toy``, the config in its metadata)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specheads.methods.api import (
    CheckReport,
    EngineVerdict,
    ExportFormat,
    ExportResult,
    FolderContents,
    check_heads,
    shape_error,
    tensor_problems,
    unknown_tensors,
    vocab_size,
)

from .heads import ToyConfig, ToyHeads

TOY_WEIGHTS = "toy.safetensors"
TENSORS = ("layer.weight", "layer.bias")


def _write(heads: ToyHeads, base: Any, name: str, engines: list[str] | None, steps: int | None) -> FolderContents:
    check_heads(heads, "toy", ToyHeads)
    config = {
        "toy_depth": heads.config.depth,
        "hidden_size": heads.config.hidden_size,
        "vocab_size": heads.config.vocab_size,
        "base_model_name_or_path": name,
    }
    tensors = {name: tensor for name, tensor in heads.state_dict().items() if name in TENSORS}
    return config, tensors, {"toy-engine": "toy-serve {out}"}, []


def _read(config: dict[str, Any], tensors: dict[str, torch.Tensor], base: Any, where: str) -> ToyHeads:
    hidden = int(base.get_output_embeddings().weight.shape[1])
    width = int(tensors["layer.weight"].shape[1])
    if width != hidden:
        raise shape_error(where, "the hidden size", width, hidden)
    toy = ToyConfig(hidden, vocab_size(base), int(config["toy_depth"]))
    return ToyHeads.from_checkpoint(asdict(toy), dict(tensors), where)


def _check(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    depth, hidden = config.get("toy_depth"), config.get("hidden_size")
    for key, value in (("toy_depth", depth), ("hidden_size", hidden)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            report.problems.append(f"{key} must be an integer >= 1, got {value!r}")
            return
    report.problems += tensor_problems(tensors, {"layer.weight": (hidden, hidden), "layer.bias": (hidden,)}, {})
    report.problems += [f"unknown tensor {name}" for name in unknown_tensors(tensors, set(TENSORS))]
    report.verdicts.append(EngineVerdict("toy-engine", True))


def _check_file(path: str | Path, target: Any) -> CheckReport:
    report = CheckReport(str(path), "toy-file")
    try:
        with safe_open(str(path), "pt") as handle:
            config = json.loads(handle.metadata()["config"])
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except Exception as error:  # safetensors raises its own types on a bad file
        report.problems.append(f"not a readable toy file: {error}")
        return report
    _check(config, tensors, report)
    return report


def _export_file(
    heads: ToyHeads, out: str | Path, base: Any, base_name: str | None, steps: int | None, dtype: Any, target: Any
) -> ExportResult:
    check_heads(heads, "toy-file", ToyHeads)
    out = Path(out)
    if out.suffix != ".toy":
        raise ValueError(f"the toy-file format writes one file: the name must end in .toy, got {out}")
    config, tensors, commands, notes = _write(heads, base, base_name or "", None, steps)
    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in tensors.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata={"config": json.dumps(config)})
    return ExportResult(out, "toy-file", _check_file(out, target), commands, notes)


FORMATS = {
    "toy": ExportFormat(
        "toy", TOY_WEIGHTS, write=_write, read=_read, check=_check, detect=lambda config, names: "toy_depth" in config
    ),
    "toy-file": ExportFormat("toy-file", "", export=_export_file, suffix=".toy", check_file=_check_file),
}
