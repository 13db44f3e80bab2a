"""Loading heads of any registered type, and binding them to the base they decode with."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specheads.heads.checkpoint import HeadCheckpointError, read_checkpoint
from specheads.heads.registry import HEAD_TYPES

CALIBRATED_TREE = "tree.json"
ADAPTER_DIR = "adapter"


def load_heads(directory: str | Path, base_model: PreTrainedModel | None = None) -> torch.nn.Module:
    """Load heads: a native checkpoint (the class from ``config.json``'s ``head_type``) or an engine layout.

    Engine layouts (``eagle3`` SpecForge/SGLang, ``speculators``, ``eagle`` EAGLE-1, ``medusa`` FasterDecoding/TGI;
    see :mod:`specheads.export`) are recognised from their config files and converted; they carry no fingerprint of
    their base, so they need ``base_model`` and every shape is checked against it.

    Args:
        directory: the checkpoint directory.
        base_model: when given, the heads are checked against it (and bound to it: its embedding / lm_head).

    Raises:
        HeadCheckpointError: missing, corrupt or pickled files; unknown head type; heads made for another base.
    """
    from specheads.export.formats import foreign_format, import_heads

    layout = foreign_format(directory) if Path(directory).is_dir() else None
    if layout not in (None, "native"):
        heads = import_heads(directory, base_model, layout)
    else:
        config, tensors = read_checkpoint(directory)
        head_type = config.get("head_type")
        if head_type not in HEAD_TYPES:
            raise HeadCheckpointError(f"{directory}: unknown head_type {head_type!r}; known: {sorted(HEAD_TYPES)}")
        heads = HEAD_TYPES[head_type].module_class().from_checkpoint(config, tensors, str(directory))
    calibrated = Path(directory) / CALIBRATED_TREE
    if calibrated.is_file():  # written by `specheads calibrate`: the best tree for these heads on that machine
        record = json.loads(calibrated.read_text())
        heads.calibrated_tree = record["choices"]
        if "dynamic" in record and hasattr(heads, "calibrated_dynamic"):
            heads.calibrated_dynamic = record["dynamic"]
    if base_model is not None:
        heads.attach_base(base_model)
        lm_head = base_model.get_output_embeddings().weight
        heads.to(device=lm_head.device, dtype=lm_head.dtype)
    return heads.eval()


def heads_for_decoding(
    heads: str | Path | torch.nn.Module, base_model: PreTrainedModel
) -> tuple[torch.nn.Module, PreTrainedModel]:
    """Heads bound to the base they decode with; a Medusa-2 checkpoint's LoRA adapter is merged into the base first.

    The heads are checked against the original base (their fingerprint), then bound to the merged one: decoding is
    lossless relative to the fine-tuned base, which is what Medusa-2 serves. Returns ``(heads, base)``.
    """
    if isinstance(heads, torch.nn.Module):
        heads.attach_base(base_model)
        return heads, base_model
    loaded = load_heads(heads, base_model)
    adapter = Path(heads) / ADAPTER_DIR
    if adapter.is_dir():
        from peft import PeftModel

        base_model = PeftModel.from_pretrained(base_model, str(adapter)).merge_and_unload().eval()
        loaded.bind_base(base_model)
    return loaded, base_model
