"""GGUF bases: a ``.gguf`` file converted once into an ordinary transformers folder, cached by the file's hash.

transformers reads GGUF files itself (``from_pretrained(folder, gguf_file=name)``, with the ``gguf`` package),
dequantizing every tensor to float32; that takes 20-30 s for a 135M model and the loaded model refuses
``save_pretrained``. So the first use of a file rebuilds the plain model from its config, copies the dequantized
state dict into it and saves that model, its tokenizer (chat template included) and generation config as
safetensors into a cache folder; every later use loads the folder (a second or two). The folder's greedy text is the
GGUF model's greedy text: the weights are the same float32 values.

Cache: ``$SPECHEADS_CACHE/gguf/<sha256 of the file, 16 hex digits>`` when ``SPECHEADS_CACHE`` is set, else
``$HF_HOME/specheads/gguf/...`` (``~/.cache/huggingface`` by default), the place huggingface tools keep their caches.
The folder is written under a temporary name and renamed into place, so a killed conversion leaves no half folder;
an existing folder is used only when its ``specheads_gguf.json`` names the same hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

GGUF_MAGIC = b"GGUF"
MARKER = "specheads_gguf.json"
INSTALL_GGUF = 'pip install "specheads[gguf]"  (or: pip install gguf)'


class GGUFError(ValueError):
    """A GGUF file that cannot be read or converted; the message names the file."""


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` names a ``.gguf`` file (by its suffix; the content is checked when it is converted)."""
    return str(path).lower().endswith(".gguf")


def cache_root() -> Path:
    """Where converted GGUF folders live: ``$SPECHEADS_CACHE/gguf``, else ``$HF_HOME/specheads/gguf``."""
    explicit = os.environ.get("SPECHEADS_CACHE")
    if explicit:
        return Path(explicit).expanduser() / "gguf"
    from huggingface_hub import constants

    return Path(constants.HF_HOME).expanduser() / "specheads" / "gguf"


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file, read in 8 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def converted_folder(path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The transformers folder for a GGUF file, converting it on first use.

    Args:
        path: the ``.gguf`` file.
        cache_dir: the cache root (default :func:`cache_root`).

    Returns:
        A folder with ``config.json``, ``model.safetensors``, the tokenizer files and ``generation_config.json``.

    Raises:
        GGUFError: the file is missing, is not a GGUF file, is truncated or corrupt, or the ``gguf`` package is missing.
    """
    path = Path(path).expanduser()
    _check_header(path)
    digest = file_sha256(path)
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    target = root / digest[:16]
    if _is_complete(target, digest):
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}.", dir=root))
    staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the cache is shared like transformers' own
    try:
        _convert(path, staging)
        (staging / MARKER).write_text(json.dumps({"source": str(path), "sha256": digest}, indent=2) + "\n")
        if target.exists():  # an incomplete or stale folder from another conversion
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _is_complete(folder: Path, digest: str) -> bool:
    marker = folder / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("sha256") == digest
    except (OSError, ValueError):
        return False


def _check_header(path: Path) -> None:
    if not path.is_file():
        raise GGUFError(f"the GGUF file {path} does not exist")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise GGUFError(f"reading {path} needs the gguf package: {INSTALL_GGUF}") from None


def _convert(path: Path, out_dir: Path) -> None:
    """Dequantize ``path`` with transformers and save the plain model, tokenizer and generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, name = str(path.parent), path.name
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers warns about every GGUF load; the conversion happens once
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as error:  # the gguf reader raises ValueError, struct.error, IndexError, ... on bad files
        raise GGUFError(f"{path} could not be read as a GGUF model (truncated or corrupt?): {error}") from error
    finally:
        hf_logging.set_verbosity(verbosity)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain float32 now
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = {key for key in missing if key.endswith("lm_head.weight")} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise GGUFError(f"{path}: rebuilding the model left missing {missing} / unexpected {unexpected} tensors")
    plain.tie_weights()
    plain.config.name_or_path = str(path)
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.model_max_length = getattr(config, "max_position_embeddings", tokenizer.model_max_length)
    tokenizer.save_pretrained(out_dir)
