"""The calibration loaded with heads: ``tree.json`` in the heads' folder, written by ``specheads calibrate``.

One file keeps one calibration per dtype and device (``"by_dtype"``, keyed by :func:`calibration_key`): the verify
cost curve, and so the best tree, differ by dtype. Loading reads the record of the base's dtype and device, else the
latest, into a typed :class:`Calibration` that the heads carry (``heads.calibration``) and that each method's
drafter and exporter read: the static tree it found best, and the fields the method's tree family recorded about the
trees its drafter grows (read back by the family: :meth:`specheads.inference.trees.TreeFamily.calibrated`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specheads.heads.checkpoint import atomic_write

CALIBRATED_TREE = "tree.json"


@dataclass(frozen=True)
class Calibration:
    """What calibration chose for these heads on one machine, dtype and device.

    Attributes:
        tree: the best static tree, as paths of candidate ranks (``[[0], [1], [0, 0]]``).
        key: the dtype and device the record was measured for (``bfloat16/cpu``); None in files that predate it.
        lookup: the settings of a prompt lookup composed with these heads (``calibrate --prompt-lookup``: tokens
            proposed by match length, :class:`specheads.inference.lookup.PromptLookup`'s record); None: not
            calibrated, the lookup's defaults hold.
        record: the whole record, whose fields about the trees the drafter grows (EAGLE-2's parameters, a DDTree
            budget, ...) the method's tree family wrote and reads back
            (:meth:`~specheads.inference.trees.TreeFamily.calibrated`).
    """

    tree: list[list[int]]
    key: str | None = None
    lookup: dict[str, Any] | None = None
    record: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Calibration:
        """The typed form of one ``tree.json`` record."""
        return cls(
            tree=[list(path) for path in record["choices"]],
            key=record.get("dtype"),
            lookup=dict(record["lookup"]) if record.get("lookup") else None,
            record=dict(record),
        )


def calibration_key(base: torch.nn.Module) -> str:
    """What a calibration is valid for besides the machine: the base's dtype and device type (``bfloat16/cpu``).

    The verify curve, and so the best tree, differ by dtype: on a CPU with bf16 units 8 tokens cost 1.25x one in
    bf16 and 1.62x in float32."""
    weight = base.get_output_embeddings().weight
    return f"{str(weight.dtype).removeprefix('torch.')}/{weight.device.type}"


def calibration_for(record: dict, base: torch.nn.Module | None) -> dict:
    """The calibration of ``tree.json``'s ``record`` that matches ``base``'s dtype and device, else its latest."""
    if base is None:
        return record
    return record.get("by_dtype", {}).get(calibration_key(base), record)


def read_calibration(directory: str | Path, base: torch.nn.Module | None = None) -> Calibration | None:
    """The calibration in ``directory`` for ``base``'s dtype and device (see :func:`calibration_for`); None when
    the folder holds no ``tree.json``."""
    path = Path(directory) / CALIBRATED_TREE
    if not path.is_file():
        return None
    return Calibration.from_record(calibration_for(json.loads(path.read_text()), base))


def write_calibration(directory: str | Path, record: dict) -> Path:
    """Write ``record`` into ``directory/tree.json`` atomically, with a plain new file's permissions.

    The file keeps one calibration per dtype and device (``"by_dtype"``, keyed by :func:`calibration_key`): a
    calibration in bf16 does not replace the float32 one. Its top level is the latest record, which loaders read when
    no record matches their base (and which files written before dtypes were recorded hold: they were float32).
    """
    path = Path(directory) / CALIBRATED_TREE
    by_dtype: dict[str, dict] = {}
    if path.is_file():
        try:
            existing = json.loads(path.read_text())
        except ValueError:
            existing = {}
        by_dtype = dict(existing.get("by_dtype", {}))
        if existing and not by_dtype and "choices" in existing:
            by_dtype[existing.get("dtype", "float32/cpu")] = existing
    record = {key: value for key, value in record.items() if key != "by_dtype"}
    by_dtype[record.get("dtype", "float32/cpu")] = record
    text = json.dumps({**record, "by_dtype": by_dtype}, indent=2) + "\n"
    atomic_write(path, lambda temporary: temporary.write_text(text))
    return path


def calibrate_arguments(record: dict) -> str | None:
    """The ``specheads calibrate`` arguments that measured ``record`` (one dtype's record of ``tree.json``), from the
    options it recorded (``--threads 2 --batches 2 --max-nodes 16 --prompt-tokens 128 --new-tokens 32``, with
    ``--prompt-lookup`` where it calibrated a lookup); None for records written before calibration recorded them.
    The dtype, the recipe and the heads' folder are the caller's to add."""
    options = record.get("options")
    if not options:
        return None
    arguments = [
        f"--{name.replace('_', '-')} {options[name]}"
        for name in ("threads", "batches", "max_nodes", "prompt_tokens", "new_tokens")
        if options.get(name) is not None
    ]
    return " ".join(arguments + (["--prompt-lookup"] if options.get("prompt_lookup") else []))
