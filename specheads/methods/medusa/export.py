"""Medusa heads in the layout the Medusa repository (FasterDecoding), TGI and TensorRT-LLM read: written, read back,
checked against its loading rules and recognised here; :mod:`specheads.export.formats` runs it through the method's
registry entry.

The layout: ``medusa_lm_head.safetensors`` with ``{head}.{layer}.linear.*`` and, per head,
``{head}.{num_layers}.weight`` (its own lm_head); a config without ``architectures``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from transformers import PreTrainedModel

from specheads.methods.api import (
    CheckReport,
    EngineVerdict,
    ExportFormat,
    FolderContents,
    HeadCheckpointError,
    check_heads,
    serving_engines,
    shape_error,
    tensor_problems,
    unknown_tensors,
    vocab_size,
)
from specheads.methods.medusa.heads import MedusaConfig, MedusaHeads

MEDUSA_WEIGHTS = "medusa_lm_head.safetensors"


def medusa_shapes(num_heads: int, num_layers: int, hidden: int, vocab: int, own_lm_head: bool) -> dict[str, tuple]:
    """``{head}.{layer}.linear.{weight,bias}`` and, with own lm_heads, ``{head}.{num_layers}.weight``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for head in range(num_heads):
        for layer in range(num_layers):
            shapes[f"{head}.{layer}.linear.weight"] = (hidden, hidden)
            shapes[f"{head}.{layer}.linear.bias"] = (hidden,)
        if own_lm_head:
            shapes[f"{head}.{num_layers}.weight"] = (vocab, hidden)
    return shapes


def _medusa(
    heads: Any, base: PreTrainedModel | None, name: str, engines: list[str] | None, steps: int | None
) -> FolderContents:
    check_heads(heads, "medusa", MedusaHeads)
    config_h = heads.config
    layers = config_h.num_layers
    tensors = {}
    for head, blocks in enumerate(heads.blocks):
        for layer, block in enumerate(blocks):
            tensors[f"{head}.{layer}.linear.weight"] = block.linear.weight
            tensors[f"{head}.{layer}.linear.bias"] = block.linear.bias
    notes = []
    if heads.lm_heads is not None:
        for head, lm_head in enumerate(heads.lm_heads):
            tensors[f"{head}.{layers}.weight"] = lm_head.weight
    elif base is not None:  # every reader then loads it as Medusa-1, each head with a copy of the base's lm_head
        for head in range(config_h.num_heads):
            tensors[f"{head}.{layers}.weight"] = base.get_output_embeddings().weight.detach().clone()
        notes.append("shared lm_head written as per-head copies of the base's (Medusa-1 layout, every reader)")
    else:
        notes.append("shared lm_head layout (no --base): TGI's MedusaHeadV2 and FasterDecoding's legacy model only")
    own = f"0.{layers}.weight" in tensors
    possible = {
        "tgi": "" if own or layers == 1 else "TGI reads shared-lm_head heads only with one layer per head",
        "tensorrt-llm": "" if own else "TensorRT-LLM reads only heads with their own lm_head (pass --base)",
        "fasterdecoding": "",
    }
    serve = serving_engines(engines, possible, "medusa")
    config = {
        "medusa_num_heads": config_h.num_heads,
        "medusa_num_layers": layers,
        "base_model_name_or_path": name,
        "hidden_size": config_h.hidden_size,
        "vocab_size": config_h.vocab_size,
    }
    commands = {}
    if "tgi" in serve:
        commands["tgi"] = f"text-generation-launcher --model-id {{out}}  (base from base_model_name_or_path: {name})"
    if "tensorrt-llm" in serve:
        commands["tensorrt-llm"] = (
            f"python examples/medusa/convert_checkpoint.py --model_dir {name or '<base>'} --medusa_model_dir {{out}} "
            f"--num_medusa_heads {config_h.num_heads} --output_dir <trt-ckpt>"
        )
    commands["fasterdecoding"] = "python -m medusa.inference.cli --model {out}"
    notes += [f"{e} not served: {possible[e]}" for e in possible if possible[e]]
    return config, tensors, commands, notes


def _import_medusa(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], base: PreTrainedModel, where: str
) -> MedusaHeads:
    heads, layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    hidden = int(base.get_output_embeddings().weight.shape[1])
    vocab = vocab_size(base)
    first = tensors.get("0.0.linear.weight")
    if first is None:
        raise HeadCheckpointError(f"{where}: no 0.0.linear.weight; not a Medusa head file")
    if tuple(first.shape) != (hidden, hidden):
        raise shape_error(where, "the hidden size", int(first.shape[1]), hidden)
    own = f"0.{layers}.weight" in tensors
    native = {}
    for head in range(heads):
        for layer in range(layers):
            for kind in ("weight", "bias"):
                native[f"blocks.{head}.{layer}.linear.{kind}"] = tensors.pop(f"{head}.{layer}.linear.{kind}")
        if own:
            lm_head = tensors.pop(f"{head}.{layers}.weight")
            if tuple(lm_head.shape) != (vocab, hidden):
                raise shape_error(where, f"head {head}'s lm_head shape", list(lm_head.shape), [vocab, hidden])
            native[f"lm_heads.{head}.weight"] = lm_head
    if tensors:
        raise HeadCheckpointError(f"{where}: tensors that fit no Medusa head: {sorted(tensors)[:4]}")
    medusa = MedusaConfig(
        num_heads=heads, num_layers=layers, hidden_size=hidden, vocab_size=vocab, share_lm_head=not own
    )
    return MedusaHeads.from_checkpoint(asdict(medusa), native, where)


def _check_medusa(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    heads, layers = config.get("medusa_num_heads"), config.get("medusa_num_layers", 1)
    for name, value in (("medusa_num_heads", heads), ("medusa_num_layers", layers)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            report.problems.append(f"{name} must be an integer >= 1, got {value!r}")
            return
    if not isinstance(config.get("base_model_name_or_path"), str):
        report.problems.append("base_model_name_or_path is missing: TGI and FasterDecoding load the base from it")
    first = tensors.get("0.0.linear.weight")
    if first is None:
        report.problems.append("missing tensor 0.0.linear.weight")
        return
    hidden = int(first.shape[1])
    lm_heads = [tensors.get(f"{h}.{layers}.weight") for h in range(heads)]
    own = any(t is not None for t in lm_heads)
    vocab = next((int(t.shape[0]) for t in lm_heads if t is not None), int(config.get("vocab_size") or 0))
    for field_name, value in (("hidden_size", hidden), ("vocab_size", vocab)):
        if field_name in config and config[field_name] != value and (field_name != "vocab_size" or own):
            report.problems.append(f"config {field_name} {config[field_name]} but the tensors have {value}")
    expected = medusa_shapes(heads, layers, hidden, vocab, own)
    report.problems += tensor_problems(tensors, expected, {})
    extra = unknown_tensors(tensors, set(expected))
    report.problems += [f"unknown tensor {name}: Medusa loaders ignore it without a word" for name in extra]
    tgi = EngineVerdict("tgi", True)
    if "architectures" in config:
        tgi.problems.append("config has 'architectures': TGI then looks for an MLP speculator and loads no Medusa")
    if not own and layers != 1:
        tgi.problems.append("shared-lm_head heads need medusa_num_layers == 1 in TGI (MedusaHeadV2)")
    tgi.note = "MedusaHeadV1" if own else "MedusaHeadV2 (the base's lm_head)"
    trt = EngineVerdict("tensorrt-llm", own, note="" if own else "reads only heads with their own lm_head")
    faster = EngineVerdict("fasterdecoding", True, note="medusa_model.py" if own else "medusa_model_legacy.py")
    report.verdicts += [tgi, trt, faster]


FORMATS = {
    "medusa": ExportFormat(
        "medusa",
        MEDUSA_WEIGHTS,
        write=_medusa,
        read=_import_medusa,
        check=_check_medusa,
        detect=lambda config, names: "medusa_num_heads" in config,
    ),
}
