"""Heads published in the layouts serving engines read, loaded as native heads.

A folder's layout is recognised by the methods' own detectors (:func:`specheads.registry.detect_layout`), and the
method that reads it builds native heads (its :class:`~specheads.registry.ExportFormat`'s ``read``). A foreign
checkpoint carries no fingerprint of its base, so every shape is checked against the base it is loaded with (hidden
size, vocabulary, feature layers, an embedding it carries; :func:`shape_error` words a mismatch) and a warning says
that this is all that was checked. Folders written by ``specheads export`` do carry specheads' record of the base (in
the safetensors metadata, which engines ignore), and importing them checks the fingerprint as for native checkpoints.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import PreTrainedModel

from specheads.heads.checkpoint import (
    CONFIG_NAME,
    PICKLE_SUFFIXES,
    HeadCheckpointError,
    base_model_info,
    check_base,
)
from specheads.heads.checkpoint import WEIGHTS_NAME as SAFETENSORS_WEIGHTS
from specheads.registry import detect_layout, export_format

METADATA_KEY = "specheads_base_model"  # safetensors metadata: specheads' record of the base (engines ignore it)


def foreign_format(directory: str | Path) -> str | None:
    """The layout of a head directory: ``"native"``, a registered export format, or None when it is none of them."""
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
    return detect_layout(config, names)


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
    tensors, metadata = read_tensors(directory, spec.weights)
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


def read_tensors(directory: Path, weights_name: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
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


def shape_error(where: str, what: str, theirs: Any, base: Any) -> HeadCheckpointError:
    return HeadCheckpointError(f"{where} was made for another base: {what} is {theirs} there but {base} for this base")
