"""Replay the serving engines' loading rules on an exported head directory.

The engines are lenient in different, silent ways (SGLang skips unknown tensor names without a word, speculators
leaves a missing ``embed_tokens`` uninitialised, vLLM leaves a missing ``d2t`` at zero and drops every ``.bias`` it
has no parameter for), so a directory that "loads" can still serve garbage. :func:`check_export` names every such
problem per engine. Which engines a directory is meant for comes from its format and its ``architectures``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from specheads.heads.checkpoint import CONFIG_NAME, PICKLE_SUFFIXES
from specheads.heads.checkpoint import WEIGHTS_NAME as SAFETENSORS_WEIGHTS
from specheads.registry import detect_layout, export_format, export_formats


@dataclass
class EngineVerdict:
    """One engine's view of a directory: whether the directory targets it, and what would go wrong there."""

    engine: str
    targeted: bool
    problems: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def loads(self) -> bool:
        return self.targeted and not self.problems


@dataclass
class CheckReport:
    """The result of :func:`check_export`: shared problems (tensors, ids) and one verdict per engine."""

    directory: str
    format: str | None
    problems: list[str] = field(default_factory=list)
    verdicts: list[EngineVerdict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        targeted = [v for v in self.verdicts if v.targeted]
        return not self.problems and bool(targeted) and all(not v.problems for v in targeted)

    @property
    def engines(self) -> list[str]:
        """The engines that load this directory correctly."""
        return [v.engine for v in self.verdicts if v.loads] if not self.problems else []

    def all_problems(self) -> list[str]:
        problems = list(self.problems)
        for verdict in self.verdicts:
            problems += [f"{verdict.engine}: {p}" for p in verdict.problems if verdict.targeted]
        if not any(v.targeted for v in self.verdicts) and self.format is not None:
            problems.append("no serving engine is targeted by this directory (see the notes)")
        return problems

    def render(self) -> str:
        """The shared problems, then one verdict per engine: an engine "loads" the directory only when neither its
        own checks nor the shared ones (tensors, ids, an unreadable file) found a problem."""
        lines = [f"{self.directory}: {self.format or 'unknown'} layout"]
        lines += [f"  problem: {p}" for p in self.problems]
        for verdict in self.verdicts:
            if not verdict.targeted:
                lines.append(f"  {verdict.engine}: not targeted ({verdict.note})")
            elif verdict.problems:
                lines += [f"  {verdict.engine}: problem: {p}" for p in verdict.problems]
            elif self.problems:
                lines.append(f"  {verdict.engine}: would not serve it correctly (the problems above)")
            else:
                lines.append(f"  {verdict.engine}: loads" + (f" ({verdict.note})" if verdict.note else ""))
        lines.append("ok" if self.ok else f"{len(self.all_problems())} problem(s)")
        return "\n".join(lines)


def check_export(directory: str | Path, format: str | None = None, target: str | Path | None = None) -> CheckReport:
    """Check ``directory`` against every engine's loading rules for its format (read from its config when None).

    A file (a ``.gguf`` draft) is checked by the format whose ``suffix`` it has, against ``target`` (the model file
    the engine serves it with) when given.
    """
    directory = Path(directory)
    report = CheckReport(str(directory), format)
    config_path = directory / CONFIG_NAME
    if directory.is_file():
        files = [export_format(f) for f in export_formats() if export_format(f).check_file is not None]
        for spec in files:
            if directory.suffix == spec.suffix and format in (None, spec.name):
                return spec.check_file(directory, target)
        report.problems.append(
            f"{directory} is a file; the file formats are {[f'{s.name} ({s.suffix})' for s in files]}"
        )
        return report
    if not directory.is_dir():
        report.problems.append(f"{directory} is not a directory")
        return report
    try:
        config = json.loads(config_path.read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        report.problems.append(f"{CONFIG_NAME} cannot be read: {error}")
        return report
    detected = detect_layout(config, None)
    folder_formats = [f for f in export_formats() if export_format(f).check is not None]
    wanted = format or detected
    weights_name = export_format(wanted, config=config).weights if wanted in folder_formats else SAFETENSORS_WEIGHTS
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        report.problems.append(f"pickle files {pickles}: engines and specheads load safetensors; remove them")
    try:
        tensors = load_file(str(directory / weights_name))
    except FileNotFoundError:
        report.problems.append(f"no {weights_name}")
        return report
    except Exception as error:  # safetensors raises its own types for truncated or corrupt files
        report.problems.append(f"{weights_name} is not a readable safetensors file: {error}")
        return report
    detected = detect_layout(config, set(tensors)) if detected is None else detected
    if format is None:
        report.format = format = detected
    elif detected is not None and detected != format:
        report.problems.append(f"the config is a {detected} config, not {format}")
        return report
    if format not in folder_formats:
        report.problems.append(f"not a layout of a serving engine (known: {sorted(folder_formats)})")
        return report
    try:
        export_format(format, config=config).check(config, tensors, report)
    except (KeyError, TypeError, ValueError) as error:
        report.problems.append(f"{CONFIG_NAME} lacks or mangles a field the engines read: {error!r}")
    return report


# ---------------------------------------------------------------------------------------------- shared tensor rules
def tensor_problems(
    tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], optional: dict[str, tuple[int, ...]]
) -> list[str]:
    """What every engine would get wrong with ``tensors``: a missing ``expected`` tensor (engines serve it
    uninitialised), a shape other than the config implies, weights in several dtypes."""
    problems = []
    for name, shape in expected.items():
        if name not in tensors:
            problems.append(f"missing tensor {name} {list(shape)} (no engine reports it; it would serve uninitialised)")
    float_dtypes = set()
    for name, tensor in tensors.items():
        shape = expected.get(name, optional.get(name))
        if shape is not None and tuple(tensor.shape) != tuple(shape):
            problems.append(f"{name} has shape {list(tensor.shape)}, the config implies {list(shape)}")
        if tensor.is_floating_point():
            float_dtypes.add(tensor.dtype)
    if len(float_dtypes) > 1:
        problems.append(f"weights in several dtypes {sorted(str(d) for d in float_dtypes)}")
    return problems


def unknown_tensors(tensors: dict[str, torch.Tensor], known: set[str]) -> list[str]:
    """The tensor names no engine's loader reads (sorted)."""
    return sorted(set(tensors) - known)


def nonzero_bias(tensors: dict[str, torch.Tensor], name: str) -> bool:
    """Whether ``name`` is present and not all zeros (an engine that drops the bias would change the outputs)."""
    return name in tensors and bool(tensors[name].float().abs().max() > 0)


def id_list(value: Any, what: str) -> list[int] | None:
    """A config's list of integer ids (None when absent).

    Raises:
        ValueError: ``value`` is not a list of integers.
    """
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ValueError(f"{what} must be a list of integers, got {value!r}")
    return value


def config_architectures(config: dict[str, Any]) -> list[str]:
    """The config's ``architectures`` (empty when absent)."""
    return [str(a) for a in config.get("architectures") or []]


# ---------------------------------------------------------------------------------------------- EAGLE-3 layouts
# ---------------------------------------------------------------------------------------------- EAGLE-1
# ---------------------------------------------------------------------------------------------- Medusa
