"""Loading heads of any registered type, and binding them to the base they decode with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from specheads.heads.calibration import read_calibration
from specheads.heads.checkpoint import HeadCheckpointError, read_checkpoint
from specheads.heads.foreign import foreign_format, import_heads
from specheads.registry import HEAD_TYPES, head_type_of

ADAPTER_DIR = "adapter"  # in a heads checkpoint: what joint training changed of the base (Medusa-2's LoRA adapter)


def load_heads(directory: str | Path, base_model: PreTrainedModel | None = None) -> torch.nn.Module:
    """Load heads: a native checkpoint (the class from ``config.json``'s ``head_type``) or an engine layout.

    Engine layouts (every layout a registry entry's ``layouts`` lists: ``eagle3`` SpecForge/SGLang, ``speculators``,
    ``eagle`` EAGLE-1, ``medusa`` FasterDecoding/TGI, ``dflash`` z-lab's DFlash, ``dspark`` DeepSpec's DSpark; see
    :mod:`specheads.heads.foreign`) are recognised from their config files and converted; they carry no fingerprint
    of their base, so they need ``base_model`` and every shape is checked against it.

    Args:
        directory: the checkpoint directory.
        base_model: when given, the heads are checked against it (and bound to it: its embedding / lm_head).

    Raises:
        HeadCheckpointError: missing, corrupt or pickled files; unknown head type; heads made for another base.
    """
    layout = foreign_format(directory) if Path(directory).is_dir() else None
    if layout not in (None, "native"):
        heads = import_heads(directory, base_model, layout)
    else:
        config, tensors = read_checkpoint(directory)
        head_type = config.get("head_type")
        if head_type not in HEAD_TYPES:
            raise HeadCheckpointError(f"{directory}: unknown head_type {head_type!r}; known: {sorted(HEAD_TYPES)}")
        heads = HEAD_TYPES[head_type].module_class().from_checkpoint(config, tensors, str(directory))
    # written by `specheads calibrate`: the best tree for these heads on that machine, in the base's dtype
    heads.calibration = read_calibration(directory, base_model)
    if base_model is not None:
        heads.attach_base(base_model)
        lm_head = base_model.get_output_embeddings().weight
        heads.to(device=lm_head.device, dtype=lm_head.dtype)
    return heads.eval()


def heads_for_decoding(
    heads: str | Path | torch.nn.Module, base_model: PreTrainedModel
) -> tuple[torch.nn.Module, PreTrainedModel]:
    """Heads bound to the base they decode with; a checkpoint trained jointly with its base (Medusa-2: a LoRA
    adapter in ``ADAPTER_DIR``) first has its method's joint training bind those changes into the base (merged).

    The heads are checked against the original base (their fingerprint), then bound to the merged one: decoding is
    lossless relative to the fine-tuned base, which is what Medusa-2 serves. Returns ``(heads, base)``.
    """
    if isinstance(heads, torch.nn.Module):
        heads.attach_base(base_model)
        return heads, base_model
    loaded = load_heads(heads, base_model)
    adapter = Path(heads) / ADAPTER_DIR
    if adapter.is_dir():
        base_model = head_type_of(loaded).bind_joint(adapter, base_model)
        loaded.bind_base(base_model)
    return loaded, base_model


def heads_path(heads: str | Path | torch.nn.Module, base: Any = None) -> str | Path | torch.nn.Module:
    """Where ``heads=`` points: ``"default"`` names the EAGLE-3 heads shipped for ``base`` (the embedded default, or a
    named real base), ``"default:<variant>"`` one of the variants shipped beside them (``"default:llamacpp"``: heads
    llama.cpp can run); anything else is returned as it is."""
    if isinstance(heads, str) and (heads == "default" or heads.startswith("default:")):
        from specheads import assets

        variant = heads.partition(":")[2] or None
        return assets.shipped_heads(
            base if isinstance(base, str) and base in assets.NAMED_BASES else "default", variant
        )
    return heads


def heads_for_comparison(
    paths: list[str], base: PreTrainedModel, base_name: str
) -> tuple[list[tuple[str, torch.nn.Module]], PreTrainedModel, bool]:
    """Several head checkpoints on one base, labelled by method or variant (numbered when several share one), for a
    benchmark.

    A single Medusa-2 checkpoint (with its LoRA adapter) replaces the base by its merged fine-tuned model, which no
    other heads were trained for: it must come alone. Returns the labelled heads, the base they decode with, and
    whether that base is the merged one.

    Raises:
        ValueError: a Medusa-2 checkpoint among others.
    """
    paths = [heads_path(path, base_name) for path in paths]
    with_adapter = [path for path in paths if (Path(path) / ADAPTER_DIR).is_dir()]
    if with_adapter and len(paths) > 1:
        raise ValueError(
            f"{with_adapter[0]} holds a Medusa-2 LoRA adapter: its base is a different (merged) model; "
            "bench it on its own, with a single --heads"
        )
    if with_adapter:
        heads, merged = heads_for_decoding(paths[0], base)
        return [("medusa2", heads)], merged, True
    loaded = [heads_for_decoding(path, base)[0] for path in paths]
    # a method with variants (DFlash / DSpark) labels rows by the variant
    kinds = [getattr(heads.config, "variant", None) or head_type_of(heads).name for heads in loaded]
    labels = [kind if kinds.count(kind) == 1 else f"{kind}{kinds[: i + 1].count(kind)}" for i, kind in enumerate(kinds)]
    return list(zip(labels, loaded, strict=True)), base, False
