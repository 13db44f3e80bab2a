"""Loading base models, draft models and tokenizers by name, path or object, and the few facts read from them
everywhere (vocabulary size, EOS ids, pad id, vocabulary agreement): one place each."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from specheads import assets, gguf


def load_causal_lm(
    model: str | Path | PreTrainedModel,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    role: str = "base",
) -> PreTrainedModel:
    """A causal LM in eval mode: an object is used as is, ``"default"`` is the embedded default base.

    Args:
        model: a ``PreTrainedModel``, a local folder, a hub id, or ``"default"`` / ``"default-draft"``.
        dtype: ``"auto"`` (:func:`resolve_dtype`'s choice for this checkpoint and device), a dtype name
            (``"float32"``, ``"bfloat16"``, ``"float16"``) or a torch dtype. A model object is cast only when a
            dtype other than ``"auto"`` is given.
        device: where to put the model (None: leave it where it is loaded).
        role: ``"base"`` or ``"draft"``: which part of the embedded default ``"default"`` names.
    """
    if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but no CUDA device is available here; use --device cpu")
    if isinstance(model, PreTrainedModel):
        loaded = model if dtype == "auto" else model.to(parse_dtype(dtype))
    else:
        path = assets.resolve(str(model), role=role)
        if str(path).startswith(("/", "./", "../", "~")) and not Path(path).expanduser().exists():
            raise FileNotFoundError(f"the {role} model folder {path} does not exist")
        _check_hub_name(str(model), path)
        with _loading_bar(path), _unknown_name(str(model), path):
            loaded = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(path, dtype, device))
    if device is not None:
        loaded = loaded.to(device)
    return loaded.eval()


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from a name (``float32``, ``bfloat16``, ``float16``, or ``torch.``-prefixed) or a dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {['auto', *DTYPES]}")
    return DTYPES[name]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 dot products in hardware (AVX512-BF16 or AMX-BF16; Linux's CPU flags).

    There, oneDNN's bf16 matrix products cost about half a float32 one and verifying up to 8 tokens costs what one
    costs; without these units bf16 is emulated and slower than float32. ``SPECHEADS_CPU_BF16=0/1`` overrides it.
    """
    forced = os.environ.get("SPECHEADS_CPU_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def checkpoint_dtype(path: str | Path) -> str | None:
    """The dtype a local checkpoint folder stores (its config's ``dtype`` / ``torch_dtype``); None when unknown."""
    config = Path(path).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    value = data.get("dtype") or data.get("torch_dtype")
    return str(value).removeprefix("torch.") if value else None


def resolve_dtype(
    path: str | Path, dtype: str | torch.dtype = "auto", device: str | torch.device | None = None
) -> str | torch.dtype:
    """The dtype to load a checkpoint in: ``dtype`` itself unless it is ``"auto"``.

    ``"auto"`` on a CPU: bfloat16 when the CPU has native bf16 products (:func:`cpu_has_native_bf16`) and the
    checkpoint is bf16 or was converted from a GGUF file of quantized weights (4-8 bits a weight: float32 adds no
    precision that matters); float32 for a bf16/fp16 checkpoint on a CPU without bf16 units (emulated bf16 is
    slower); otherwise the checkpoint's own dtype. On a GPU, the checkpoint's own dtype (transformers' ``"auto"``).
    Measured on this project's CPU (AVX512-BF16, 2 threads, SmolLM2-135M): a bf16 one-token forward costs 0.69x a
    float32 one and an 8-token verify 1.25x the one-token bf16 forward (1.62x in float32).
    """
    if dtype != "auto":
        return parse_dtype(dtype)
    if device is not None and torch.device(device).type != "cpu":
        return "auto"
    stored = checkpoint_dtype(path)
    if cpu_has_native_bf16():
        if stored == "bfloat16" or gguf.was_quantized(path):
            return torch.bfloat16
        return "auto"
    if stored in ("bfloat16", "float16"):
        return torch.float32
    return "auto"


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
    path = assets.resolve(str(tokenizer))
    _check_hub_name(str(tokenizer), path)
    with _unknown_name(str(tokenizer), path):
        return AutoTokenizer.from_pretrained(path)


def _hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` set now, or when huggingface_hub read it at import (it then refuses every request)."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on") or constants.HF_HUB_OFFLINE


def _not_a_model(name: str, hub: str) -> ValueError:
    """The one-line error for a name that is no local folder, no .gguf file, no named base and, as a hub id,
    cannot be served (``hub`` says why)."""
    import difflib

    named = [*assets.NAMED_BASES, "default"]
    close = difflib.get_close_matches(name, named, n=1)
    return ValueError(
        f"{name!r} is neither a local folder, a .gguf file nor a named base"
        + (f" (did you mean {close[0]!r}?)" if close else "")
        + f"; named bases: {', '.join(named)}; as a hub id, {hub}"
    )


def _check_hub_name(name: str, path: str | Path) -> None:
    """Fail fast, in one line, for a name that can only be a hub id the hub cannot serve now.

    transformers asks the hub for a file it has not cached, and when the hub cannot be reached, huggingface_hub
    retries with backoff for about a minute before the error. Here one request, without retries, decides: a name
    that is no valid hub id, a hub that is offline (``HF_HUB_OFFLINE``) or unreachable, or a hub without that
    model is a :class:`ValueError` at once. A local folder, and a hub id cached before, are left to transformers
    (which serves the cached files offline).
    """
    if Path(path).expanduser().exists():
        return
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError, HFValidationError, RepositoryNotFoundError

    repo_id = str(path)
    try:
        cached = [try_to_load_from_cache(repo_id, file) for file in ("config.json", "tokenizer_config.json")]
    except HFValidationError as error:
        raise _not_a_model(name, f"it is not valid ({error})") from None
    if any(isinstance(file, str) for file in cached):
        return
    if _hub_offline():
        raise _not_a_model(name, "the hub is offline (HF_HUB_OFFLINE) and it is not in the cache")
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=10)  # one request, no retries
    except EntryNotFoundError:  # the repository is there; transformers says what it lacks
        return
    except RepositoryNotFoundError:
        raise _not_a_model(name, "the hub has no such model (or it is private or gated: hf auth login)") from None
    except Exception as error:  # the network's errors (httpx's, by huggingface_hub version) and the hub's own
        raise _not_a_model(name, f"the hub could not be reached ({type(error).__name__}: {error})") from None


@contextmanager
def _unknown_name(name: str, path: str | Path) -> Iterator[None]:
    """Turn transformers' hub error for a name that is no local folder into one line: what the name is not, the
    named bases, and whether the hub is offline."""
    try:
        yield
    except OSError as error:
        if Path(path).expanduser().exists():
            raise
        hub = "the hub is offline (HF_HUB_OFFLINE)" if _hub_offline() else f"the hub could not serve it ({error})"
        raise _not_a_model(name, hub) from None


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


def base_layer_shape(base: PreTrainedModel) -> dict[str, Any]:
    """The draft layer's dimensions read from any transformers base config (Llama, Qwen2, Mistral, GPT-2, ...)."""
    config = base.config
    hidden = int(base.get_output_embeddings().weight.shape[1])
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0))
    kv_heads = int(getattr(config, "num_key_value_heads", 0) or heads)
    head_dim = int(getattr(config, "head_dim", 0) or hidden // heads)
    intermediate = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    eps = getattr(config, "rms_norm_eps", None) or getattr(config, "layer_norm_epsilon", None) or 1e-6
    rope = getattr(config, "rope_parameters", None) or {}
    rope = {k: v for k, v in dict(rope).items() if isinstance(v, (int, float, str, list, dict)) or v is None}
    rope.setdefault("rope_type", "default")
    rope.setdefault("rope_theta", float(getattr(config, "rope_theta", 10000.0) or 10000.0))
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048
    return {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": int(intermediate),
        "rms_norm_eps": float(eps),
        "rope_parameters": rope,
        "max_position_embeddings": int(positions),
    }
