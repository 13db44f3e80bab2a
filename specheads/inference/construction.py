"""Building a decoder from names: a base, heads or a draft model, and the method they imply.

``SpecDecoder.from_pretrained`` calls :func:`build`; the CLI and scripts resolve ``heads="default"`` with
:func:`specheads.heads.loading.heads_path`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.heads.loading import heads_path
from specheads.inference.drafters import Drafter, DraftModelDrafter, NoDrafter, PromptLookupDrafter
from specheads.registry import HEAD_TYPES, head_type_of, method_of_layout

METHODS = (*HEAD_TYPES, "draft", "prompt-lookup", "none")
_UNKNOWN_HEADS = next(iter(HEAD_TYPES))  # a folder with no head type: its loader says what is wrong with it


def build(
    base: str | Path | PreTrainedModel,
    heads: str | Path | torch.nn.Module | None = None,
    draft_model: str | Path | PreTrainedModel | None = None,
    method: str | None = None,
    tokenizer: str | PreTrainedTokenizerBase | None = None,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    num_speculative_tokens: int | None = None,
) -> tuple[PreTrainedModel, Drafter, PreTrainedTokenizerBase | None]:
    """The base model, the drafter and the tokenizer of :meth:`SpecDecoder.from_pretrained` (same arguments)."""
    from specheads.loading import check_same_tokenizer, load_causal_lm, load_tokenizer

    if method is None:
        inferred = heads_method(heads, base) if heads is not None else "none"
        method = "draft" if draft_model is not None else inferred
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")
    if method in HEAD_TYPES and heads is None:
        raise ValueError(f"method {method!r} needs heads= (a head checkpoint directory or a heads module)")
    if method == "draft" and draft_model is None:
        raise ValueError("method 'draft' needs draft_model=")
    base_model = load_causal_lm(base, dtype=dtype, device=device)
    if tokenizer is None and isinstance(base, (str, Path)):
        tokenizer = base
    tokenizer = load_tokenizer(tokenizer) if tokenizer is not None else None
    drafter: Drafter
    if method == "draft":
        check_same_tokenizer(tokenizer, draft_model)
        draft = load_causal_lm(draft_model, dtype=dtype, device=base_model.device, role="draft")
        drafter = DraftModelDrafter(draft, num_speculative_tokens or 5)
    elif method in HEAD_TYPES:
        from specheads.heads.loading import heads_for_decoding

        loaded_heads, base_model = heads_for_decoding(heads_path(heads, base), base_model)
        if head_type_of(loaded_heads).name != method:
            raise ValueError(f"method {method!r} was asked for but the heads are {head_type_of(loaded_heads).name}")
        drafter = HEAD_TYPES[method].make_drafter(loaded_heads)
    elif method == "prompt-lookup":
        drafter = PromptLookupDrafter(num_speculative_tokens or 10)
    else:
        drafter = NoDrafter()
    return base_model, drafter, tokenizer


def calibrated_lookup(drafter: Drafter) -> dict[str, Any] | None:
    """The prompt-lookup settings calibrated with a drafter's heads (their ``tree.json``), None when there are none.
    The heads are the drafter's ``head`` (EAGLE, DFlash) or ``heads`` (Medusa)."""
    heads = next((getattr(drafter, name) for name in ("head", "heads") if hasattr(drafter, name)), None)
    return getattr(getattr(heads, "calibration", None), "lookup", None)


def heads_method(heads: str | Path | torch.nn.Module, base: Any = None) -> str:
    """The head type of a heads module or checkpoint directory (its ``head_type``, or its engine layout's method)."""
    if isinstance(heads, torch.nn.Module):
        return head_type_of(heads).name
    import json

    from specheads.heads.foreign import foreign_format

    directory = Path(heads_path(heads, base))
    layout = foreign_format(directory) if directory.is_dir() else None
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return _UNKNOWN_HEADS  # the loader names what is wrong with the directory
    method = method_of_layout(layout, config if isinstance(config, dict) else None) if layout is not None else None
    if method is not None:
        return method.name
    try:
        return str(config["head_type"])
    except (KeyError, TypeError):
        return _UNKNOWN_HEADS
