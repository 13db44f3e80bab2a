"""Export specheads heads to the layouts serving engines read, and import heads published in those layouts.

Export writes into a temporary folder next to ``out``, replays the engines' loading rules on it
(:func:`~specheads.export.check.check_export`) and only then renames it to ``out``: a refused or failed export leaves
nothing behind, and an existing non-empty ``out`` is never touched.

Import (:func:`import_heads`) builds native :class:`~specheads.heads.EagleHead` / :class:`~specheads.heads.MedusaHeads`
from a foreign layout. A foreign checkpoint carries no fingerprint of its base, so every shape is checked against the
base it is loaded with (hidden size, vocabulary, feature layers, an embedding it carries) and a warning says that this
is all that was checked. Directories written by :func:`export_heads` do carry specheads' record of the base (in the
safetensors metadata, which engines ignore), and importing them checks the fingerprint as for native checkpoints.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from specheads.export.check import PICKLE_SUFFIXES, CheckReport, check_export, detect_format
from specheads.export.layouts import CONFIG_NAME, SAFETENSORS_WEIGHTS
from specheads.heads.checkpoint import HeadCheckpointError, base_model_info, check_base
from specheads.methods.registry import export_formats, head_type_of, methods_of_format

FORMATS = export_formats()  # every method's formats (the registry's ``formats``)
METADATA_KEY = "specheads_base_model"  # safetensors metadata: specheads' record of the base (engines ignore it)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ExportFormat:
    """One engine layout a method writes (its ``export.py`` lists them; its registry entry names that list).

    Attributes:
        name: the ``--format`` name.
        weights: the safetensors file of a folder layout ("" for a format with its own ``export``).
        write: ``write(heads, base, base_name, engines, steps) -> (config, tensors, serve commands, notes)`` of a
            folder layout; :func:`export_heads` casts, writes, checks and renames the folder.
        export: ``export(heads, out, base, base_name, steps, dtype, target) -> ExportResult``, for a format that is
            not a folder of config + safetensors (one GGUF file).
        read: ``read(config, tensors, base, where) -> heads``: native heads from a folder of this layout.
        check: ``check(config, tensors, report)``: replay the engines' loading rules into ``report``.
        detect: ``detect(config, tensor_names) -> bool``: a folder's config (and tensor names when the config is
            silent, None before they are read) is this layout.
        fallback: ``detect`` claims a whole family of layouts (any speculators model type), so that a method whose
            detector is specific to its own members of the family wins over it.
    """

    name: str
    weights: str
    write: Callable[..., tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, str], list[str]]] | None = None
    export: Callable[..., ExportResult] | None = None
    read: Callable[..., torch.nn.Module] | None = None
    check: Callable[[dict[str, Any], dict[str, torch.Tensor], CheckReport], None] | None = None
    detect: Callable[[dict[str, Any], set[str] | None], bool] | None = None
    fallback: bool = False


def export_format(
    format: str, heads: torch.nn.Module | None = None, config: dict[str, Any] | None = None
) -> ExportFormat:
    """The :class:`ExportFormat` named ``format``, from the registry entry of the method that writes it.

    When several methods write ``format`` (``speculators``), ``heads`` (their type) or ``config`` (a folder's
    ``config.json``, by the methods' own detectors) picks the method; without either, the first.

    Raises:
        ValueError: no method writes ``format``.
    """
    methods = methods_of_format(format)
    specs = [method.export_formats()[format] for method in methods]
    if len(specs) == 1:
        return specs[0]
    if heads is not None:
        try:
            own = head_type_of(heads)
        except ValueError:
            own = None
        for method, spec in zip(methods, specs, strict=True):
            if method is own:
                return spec
    if config is not None:
        matching = [spec for spec in specs if spec.detect is not None and spec.detect(config, None)]
        matching.sort(key=lambda spec: spec.fallback)
        if matching:
            return matching[0]
    return specs[0]


@dataclass
class ExportResult:
    """What :func:`export_heads` wrote and where it serves."""

    directory: Path
    format: str
    report: CheckReport
    commands: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"wrote {self.format} heads to {self.directory}", self.report.render()]
        if self.commands:
            lines.append("serve with:")
            lines += [f"  {engine}: {command}" for engine, command in self.commands.items()]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


# ================================================================================================ export
def export_heads(
    heads: torch.nn.Module,
    out: str | Path,
    format: str,
    base_model: PreTrainedModel | None = None,
    base_name: str | None = None,
    engines: list[str] | None = None,
    num_speculative_tokens: int | None = None,
    dtype: str | torch.dtype | None = None,
    target_gguf: str | Path | None = None,
) -> ExportResult:
    """Write ``heads`` to ``out`` in ``format`` and check the result against the engines that serve it.

    Args:
        heads: an :class:`EagleHead` or :class:`MedusaHeads` (checked against ``base_model`` when both are given).
        out: a new (or empty) directory.
        format: ``eagle3`` | ``speculators`` | ``eagle`` | ``medusa`` | ``gguf`` (an EAGLE-3 draft file for
            llama.cpp; ``out`` is then a new ``.gguf`` file).
        base_model: the base the heads belong to. ``speculators`` needs it (it writes the base's ``embed_tokens``,
            which speculators never fills in itself); Medusa heads with a shared lm_head write per-head copies of it.
        base_name: the base's hub id or path written into the config and the serve commands (default: the base's
            ``name_or_path``).
        engines: the engines the export must serve (default: every engine the heads can serve in this format).
            Naming one that cannot serve the heads (vLLM with a non-zero EAGLE-1 fc bias) is an error.
        num_speculative_tokens: draft length written for vLLM (default: the calibrated depth, else 3).
        dtype: ``float32`` | ``bfloat16`` | ``float16`` (default: the heads' own; ``gguf``: float32, with norms
            always float32 as llama.cpp's converter keeps them).
        target_gguf: ``gguf`` only: the base's GGUF file llama.cpp serves, whose tokenizer the draft copies and whose
            vocabulary and depth it is checked against (default: the vocabulary is built from the base's tokenizer).

    Raises:
        ValueError: unknown format, heads of the wrong type for it, a base the format needs is missing, ``out``
            exists and is not empty, or an engine was asked for that cannot serve the heads.
    """
    spec = export_format(format, heads=heads)  # an unknown format is refused here
    if spec.export is not None:
        return spec.export(heads, out, base_model, base_name, num_speculative_tokens, dtype, target_gguf)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory; refusing to overwrite it (nothing was written)")
    if base_model is not None:
        heads.attach_base(base_model)
    name = base_name or (getattr(base_model.config, "_name_or_path", "") if base_model is not None else "")
    name = name or heads.config.base_model.get("name_or_path", "") or ""
    if name and Path(name).expanduser().exists():  # a local folder: absolute, or engines read it as a hub id
        name = str(Path(name).expanduser().resolve())
    config, tensors, serve, notes = spec.write(heads, base_model, name, engines, num_speculative_tokens)
    cast = DTYPES[dtype] if isinstance(dtype, str) else dtype
    if isinstance(dtype, str) and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {list(DTYPES)}")
    tensors = {
        key: (t.to(cast) if cast is not None and t.is_floating_point() else t).detach().cpu().contiguous()
        for key, t in tensors.items()
    }
    float_dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), torch.float32)
    if "medusa_num_heads" not in config:
        config["torch_dtype"] = str(float_dtype).removeprefix("torch.")
    metadata = {"format": "pt", METADATA_KEY: json.dumps(heads.config.base_model)}
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        save_file(tensors, str(staging / spec.weights), metadata=metadata)
        (staging / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        report = check_export(staging, format)
        if not report.ok:
            raise RuntimeError(
                f"specheads wrote a {format} directory that fails its own checks: {report.all_problems()}"
            )
        staging.chmod(0o755)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    report.directory = str(out)
    # Absolute: engines read a relative directory name as a hub id.
    commands = {engine: command.replace("{out}", str(out.resolve())) for engine, command in serve.items()}
    return ExportResult(out, format, report, commands, notes)


def export_named(
    heads: str | Path,
    out: str | Path,
    format: str,
    base: str | None = None,
    engines: list[str] | None = None,
    num_speculative_tokens: int | None = None,
    dtype: str | None = None,
    target_gguf: str | Path | None = None,
) -> ExportResult:
    """:func:`export_heads` from names, as ``specheads export`` takes them.

    ``heads`` is a checkpoint directory or ``"default"`` (the heads shipped for ``base``); ``base`` a folder, a hub
    id, ``"default"``, a named real base or a GGUF file. The serve commands name the folder engines load (a named or
    GGUF base: its converted folder), and the ``gguf`` format takes the named base's GGUF as its target by default.
    """
    from specheads import assets
    from specheads.gguf import is_gguf
    from specheads.heads.loading import ADAPTER_DIR, heads_path, load_heads
    from specheads.loading import load_causal_lm

    if heads == "default" and base is None:
        raise ValueError("--heads default are the heads shipped for --base (default, or a named base)")
    heads_dir = Path(heads_path(heads, base))
    base_model = load_causal_lm(base) if base else None
    loaded = load_heads(heads_dir, base_model)
    base_name = base
    if base == "default" or base in assets.NAMED_BASES or (base and is_gguf(base)):
        base_name = str(Path(assets.resolve(base)).resolve())  # the folder engines load (a GGUF's converted one)
    elif base and Path(base).is_dir():
        base_name = str(Path(base).resolve())
    if target_gguf is None and format == "gguf" and base:
        if base in assets.NAMED_BASES:
            target_gguf = str(assets.named_gguf(base))
        elif is_gguf(base):
            target_gguf = base
    result = export_heads(
        loaded,
        out,
        format,
        base_model=base_model,
        base_name=base_name,
        engines=engines,
        num_speculative_tokens=num_speculative_tokens,
        dtype=dtype,
        target_gguf=target_gguf,
    )
    if (heads_dir / ADAPTER_DIR).is_dir():
        result.notes.append(f"Medusa-2 heads: serve the base with the LoRA adapter in {heads_dir / ADAPTER_DIR} merged")
    return result


def check_heads(heads: torch.nn.Module, format: str, kind: type, version: int | None = None) -> None:
    """Refuse heads that ``format`` does not hold: another class, or another ``version`` of it.

    Classes name themselves by ``family`` (``EAGLE``, ``Medusa``) and, when versioned, ``family-version``.
    """
    if isinstance(heads, kind) and (version is None or heads.config.version == version):
        return
    want = kind.family if version is None else f"{kind.family}-{version}"
    config_version = getattr(getattr(heads, "config", None), "version", None)
    family = getattr(heads, "family", None)
    have = f"{family}-{config_version}" if family and config_version is not None else type(heads).__name__
    raise ValueError(f"the {format} format holds {want} heads; these are {have} heads")


def _engines(wanted: list[str] | None, possible: dict[str, str], format: str) -> list[str]:
    """The engines to serve: ``possible`` maps engine -> '' (can serve) or the reason it cannot."""
    if wanted is None:
        return [engine for engine, reason in possible.items() if not reason]
    for engine in wanted:
        if engine not in possible:
            raise ValueError(f"the {format} format is not served by {engine!r}; engines: {sorted(possible)}")
        if possible[engine]:
            raise ValueError(f"{engine} cannot serve these heads: {possible[engine]}")
    return list(wanted)


def _speculative_tokens(heads: torch.nn.Module, requested: int | None) -> int:
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {requested!r}")
        return requested
    dynamic = getattr(heads, "calibrated_dynamic", None) or {}
    return int(dynamic.get("depth", 3))


def _vllm_command(base: str, method: str, steps: int) -> str:
    spec = json.dumps({"method": method, "model": "{out}", "num_speculative_tokens": steps})
    return f"vllm serve {base or '<base>'} --speculative-config '{spec}'"


def _llamacpp_command(base: str, steps: int) -> str:
    """Convert with llama.cpp's own converter (or write the file directly: specheads export --format gguf), serve."""
    return (
        f"python convert_hf_to_gguf.py {{out}} --target-model-dir {base or '<base>'} --outfile draft.gguf "
        f"(or specheads export --format gguf --out draft.gguf), then "
        f"llama-server -m <base.gguf> -md draft.gguf --spec-type draft-eagle3 --spec-draft-n-max {steps}"
    )


# ================================================================================================ import
def foreign_format(directory: str | Path) -> str | None:
    """The layout of a head directory: ``"native"``, one of :data:`FORMATS`, or None when it is none of them."""
    config_path = Path(directory) / CONFIG_NAME
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    names = None
    weights = Path(directory) / SAFETENSORS_WEIGHTS  # a layout whose config is silent names itself by its tensors
    if weights.is_file():
        try:
            with safe_open(str(weights), "pt") as handle:
                names = set(handle.keys())
        except Exception:  # a corrupt file: the loader names it
            names = None
    return detect_format(config, names)


def import_heads(directory: str | Path, base_model: PreTrainedModel | None, format: str) -> torch.nn.Module:
    """Native heads from a foreign layout (see the module docstring for what is checked)."""
    directory = Path(directory)
    where = str(directory)
    if base_model is None:
        raise HeadCheckpointError(
            f"{where} is a {format} checkpoint, which records no fingerprint of its base: load it with its base "
            "(load_heads(dir, base_model)) so that every shape can be checked against it"
        )
    config = json.loads((directory / CONFIG_NAME).read_text())
    spec = export_format(format, config=config)
    tensors, metadata = _read_tensors(directory, spec.weights)
    recorded = json.loads(metadata[METADATA_KEY]) if METADATA_KEY in metadata else None
    try:
        heads = spec.read(config, tensors, base_model, where)
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, HeadCheckpointError):
            raise
        raise HeadCheckpointError(f"{where}: not a loadable {format} checkpoint: {error}") from error
    if recorded:
        check_base(recorded, base_model, f"the heads exported to {where}")
    else:
        warnings.warn(
            f"{where} is a {format} checkpoint without a fingerprint of its base: only its shapes were checked "
            f"against this base (hidden size, vocabulary, feature layers, embedding); make sure it was trained for it",
            stacklevel=3,
        )
    heads.config.base_model = recorded or base_model_info(base_model)
    return heads


def _read_tensors(directory: Path, weights_name: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    path = directory / weights_name
    if not path.is_file():
        pickles = sorted(p for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise HeadCheckpointError(
                f"{pickles[0]} is a pickle-based file; specheads never unpickles checkpoints (arbitrary code "
                f"execution). Convert it once in a trusted environment: safetensors.torch.save_file(torch.load(path), "
                f"'{directory / weights_name}')"
            )
        if (directory / f"{weights_name}.index.json").is_file():
            raise HeadCheckpointError(f"{directory}: sharded head checkpoints are not supported; merge the shards")
        raise HeadCheckpointError(f"{directory} holds no {weights_name}")
    try:
        with safe_open(str(path), "pt") as handle:
            metadata = handle.metadata() or {}
        return load_file(str(path)), metadata
    except Exception as error:  # safetensors raises its own error types for truncated or corrupt files
        raise HeadCheckpointError(f"{path} is not a readable safetensors file: {error}") from error


def _shape_error(where: str, what: str, theirs: Any, base: Any) -> HeadCheckpointError:
    return HeadCheckpointError(f"{where} was made for another base: {what} is {theirs} there but {base} for this base")
