"""Export specheads heads to the layouts serving engines read: vLLM, SGLang, speculators, TGI, TensorRT-LLM folders
and llama.cpp's GGUF draft file.

Export writes into a temporary folder (a one-file format such as ``gguf``: a temporary file) next to ``out``, replays
the engines' loading rules on it (:func:`~specheads.export.check.check_export`) and only then renames it to ``out``: a
refused or failed export leaves nothing behind, and an existing non-empty ``out`` is never touched. Each method writes
its own layouts (its ``export.py``; the registry's :class:`~specheads.registry.ExportFormat` records); the helpers
those writers share are public here (:func:`check_heads`, :func:`serving_engines`, :func:`speculative_tokens`, the
serve commands). Import (heads published in these layouts, loaded as native heads) lives in
:mod:`specheads.heads.foreign`, below both.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel

from specheads.export.check import CheckReport, check_export
from specheads.heads.checkpoint import CONFIG_NAME
from specheads.heads.foreign import METADATA_KEY
from specheads.registry import export_format, export_formats

FORMATS = export_formats()  # every method's formats (the registry's ``formats``)
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose loaders the speculators layouts were read from
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
        heads: heads of a method whose registry entry lists ``format`` (checked against ``base_model`` when both
            are given).
        out: a new (or empty) directory.
        format: one of :data:`FORMATS`, the registry's formats (``eagle3``, ``speculators``, ``eagle``, ``gguf``,
            ``medusa``, ``dflash``, ``dspark``); ``gguf`` is an EAGLE-3 draft file for llama.cpp, and ``out`` is then
            a new ``.gguf`` file.
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
    fold_norms: bool = False,
    fold_text: str | Path | None = None,
) -> ExportResult:
    """:func:`export_heads` from names, as ``specheads export`` takes them.

    ``heads`` is a checkpoint directory or ``"default"`` (the heads shipped for ``base``); ``base`` a folder, a hub
    id, ``"default"``, a named real base or a GGUF file. The serve commands name the folder engines load (a named or
    GGUF base: its converted folder), and the ``gguf`` format takes the named base's GGUF as its target by default.
    ``fold_norms`` (``gguf`` only) first rewrites EAGLE 3.1 heads into llama.cpp's graph
    (:mod:`specheads.methods.eagle.fold`, an approximation of the draft), from the base's features on ``fold_text``
    (a text file; default: the shipped benchmark prompts).
    """
    from specheads import assets
    from specheads.gguf import is_gguf
    from specheads.heads.loading import ADAPTER_DIR, heads_path, load_heads
    from specheads.loading import load_causal_lm

    if heads == "default" and base is None:
        raise ValueError("--heads default are the heads shipped for --base (default, or a named base)")
    if fold_norms and format != "gguf":
        raise ValueError("--fold-norms rewrites EAGLE 3.1 heads for llama.cpp's graph: it goes with --format gguf")
    if fold_norms and not base:
        raise ValueError("--fold-norms reads the base's features on calibration text: pass --base")
    if fold_text is not None and not fold_norms:
        raise ValueError("--fold-text is the calibration text of --fold-norms")
    if fold_text is not None and not Path(fold_text).is_file():
        raise ValueError(f"--fold-text {fold_text}: no such file")
    if fold_text is not None and not Path(fold_text).read_text(encoding="utf-8").strip():
        raise ValueError(f"--fold-text {fold_text} is empty: the fold needs the base's features on some text")
    heads_dir = Path(heads_path(heads, base))
    base_model = load_causal_lm(base) if base else None
    loaded = load_heads(heads_dir, base_model)
    fold_notes = []
    if fold_norms:
        loaded, fold_notes = _fold(loaded, base_model, base, format, fold_text)
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
    result.notes += fold_notes
    return result


def _fold(
    heads: torch.nn.Module, base_model: PreTrainedModel, base: str, format: str, fold_text: str | Path | None
) -> tuple[torch.nn.Module, list[str]]:
    """``heads`` rewritten by ``format``'s adapter (gguf: EAGLE 3.1's norms folded into llama.cpp's graph) from the
    base's activations on ``fold_text`` (default: the shipped benchmark prompts), with the notes that say so."""
    from specheads import assets
    from specheads.loading import load_tokenizer

    adapt = export_format(format, heads=heads).adapt
    if adapt is None:
        raise ValueError(f"--fold-norms: the {format} format holds these heads as they are; there is nothing to fold")
    if fold_text is None:
        texts, source = assets.prompt_texts(), "the shipped benchmark prompts"
    else:
        texts, source = [Path(fold_text).read_text(encoding="utf-8")], str(fold_text)
    adapted, notes = adapt(heads, base_model, load_tokenizer(base), texts)
    if adapted is heads:
        raise ValueError("--fold-norms: these heads have no EAGLE 3.1 norms, llama.cpp runs them as they are")
    return adapted, [*notes, f"calibration text: {source}"]


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


def serving_engines(wanted: list[str] | None, possible: dict[str, str], format: str) -> list[str]:
    """The engines to serve: ``possible`` maps engine -> '' (can serve) or the reason it cannot."""
    if wanted is None:
        return [engine for engine, reason in possible.items() if not reason]
    for engine in wanted:
        if engine not in possible:
            raise ValueError(f"the {format} format is not served by {engine!r}; engines: {sorted(possible)}")
        if possible[engine]:
            raise ValueError(f"{engine} cannot serve these heads: {possible[engine]}")
    return list(wanted)


def speculative_tokens(requested: int | None, default: int = 3) -> int:
    """The draft length an export writes: ``requested`` (checked), else the method's ``default`` (EAGLE's: the depth
    of the tree calibrated for the heads).

    Raises:
        ValueError: ``requested`` is not an integer >= 1.
    """
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {requested!r}")
        return requested
    return default


def vllm_command(base: str, method: str, steps: int) -> str:
    spec = json.dumps({"method": method, "model": "{out}", "num_speculative_tokens": steps})
    return f"vllm serve {base or '<base>'} --speculative-config '{spec}'"


def llamacpp_command(base: str, steps: int) -> str:
    """Convert with llama.cpp's own converter (or write the file directly: specheads export --format gguf), serve."""
    return (
        f"python convert_hf_to_gguf.py {{out}} --target-model-dir {base or '<base>'} --outfile draft.gguf "
        f"(or specheads export --format gguf --out draft.gguf), then "
        f"llama-server -m <base.gguf> -md draft.gguf --spec-type draft-eagle3 --spec-draft-n-max {steps}"
    )
