"""Loading base models, draft models and tokenizers by name, path or object, and the few facts read from them
everywhere (vocabulary size, EOS ids, pad id, vocabulary agreement): one place each."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from specheads import assets


def load_causal_lm(
    model: str | Path | PreTrainedModel,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    role: str = "base",
) -> PreTrainedModel:
    """A causal LM in eval mode: an object is used as is, ``"default"`` is the embedded default base.

    Args:
        model: a ``PreTrainedModel``, a local folder, a hub id, or ``"default"`` / ``"default-draft"``.
        dtype: ``"auto"`` (the checkpoint's dtype) or a torch dtype.
        device: where to put the model (None: leave it where it is loaded).
        role: ``"base"`` or ``"draft"``: which part of the embedded default ``"default"`` names.
    """
    if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but no CUDA device is available here; use --device cpu")
    if isinstance(model, PreTrainedModel):
        loaded = model
    else:
        path = assets.resolve(str(model), role=role)
        if str(path).startswith(("/", "./", "../", "~")) and not Path(path).expanduser().exists():
            raise FileNotFoundError(f"the {role} model folder {path} does not exist")
        with _loading_bar(path):
            loaded = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if device is not None:
        loaded = loaded.to(device)
    return loaded.eval()


# Below this, a local checkpoint loads in well under a second and transformers' per-tensor "Loading weights" bar
# is noise between a command's own output; above it (or for a hub id) the bar says what the wait is for.
QUIET_LOAD_BYTES = 512 * 1024 * 1024


@contextmanager
def _loading_bar(path: str | Path) -> Iterator[None]:
    """transformers' weight-loading bar, left on only for checkpoints big enough to make a user wait."""
    folder = Path(path).expanduser()
    small = folder.is_dir() and sum(f.stat().st_size for f in folder.glob("*.safetensors")) < QUIET_LOAD_BYTES
    if not small or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_tokenizer(tokenizer: str | Path | PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """A tokenizer from an object, a folder, a hub id or ``"default"``."""
    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    return AutoTokenizer.from_pretrained(assets.resolve(str(tokenizer)))


def check_same_tokenizer(
    base_tokenizer: PreTrainedTokenizerBase | None,
    draft: str | Path | PreTrainedModel,
    draft_tokenizer: PreTrainedTokenizerBase | None = None,
) -> None:
    """Raise ``ValueError`` when the draft model's own tokenizer differs from the base's.

    A draft given as an object, or a folder without tokenizer files, is checked only through its vocabulary size
    (see :func:`check_same_vocabulary`).
    """
    if base_tokenizer is None:
        return
    if draft_tokenizer is None and not isinstance(draft, PreTrainedModel):
        folder = Path(assets.resolve(str(draft), role="draft"))
        if folder.is_dir() and any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            draft_tokenizer = AutoTokenizer.from_pretrained(folder)
    if draft_tokenizer is not None and draft_tokenizer.get_vocab() != base_tokenizer.get_vocab():
        raise ValueError(
            "the draft model's tokenizer differs from the base's (different vocabularies); speculative decoding "
            "with a draft model needs the base's tokenizer"
        )


def vocab_size(model: PreTrainedModel) -> int:
    """Rows of the output embedding: the width of the logits (``config.vocab_size`` can differ after resizing)."""
    return int(model.get_output_embeddings().weight.shape[0])


def check_same_vocabulary(base: PreTrainedModel, draft: PreTrainedModel) -> None:
    """Raise ``ValueError`` unless the draft model's logits cover the same vocabulary as the base's."""
    if vocab_size(base) != vocab_size(draft):
        raise ValueError(
            f"the draft model's vocabulary ({vocab_size(draft)} tokens) differs from the base's ({vocab_size(base)}); "
            "a draft model must share the base's tokenizer"
        )


def eos_token_ids(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None = None,
    override: int | Sequence[int] | None = None,
) -> frozenset[int]:
    """The ids that end a generation: ``override``, else the model's generation config, else the tokenizer's EOS."""
    eos = override
    if eos is None:
        eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def pad_token_id(model: PreTrainedModel | None = None, tokenizer: PreTrainedTokenizerBase | None = None) -> int | None:
    """The id to pad batches with: the tokenizer's pad, the generation config's pad, then the first EOS id (padding
    is masked out, so any real id will do); None when there is none of them."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    candidates = (
        getattr(tokenizer, "pad_token_id", None),
        getattr(config, "pad_token_id", None),
        eos[0] if isinstance(eos, (list, tuple)) and eos else eos,
        getattr(tokenizer, "eos_token_id", None),
    )
    return next((int(token) for token in candidates if isinstance(token, int)), None)
