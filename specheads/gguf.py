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
an existing folder is used only when its ``specheads_gguf.json`` names the same hash. The temporary folder of a
conversion that was killed outright (out of memory, SIGKILL) is removed by the next conversion of the same file on
the same machine. Before converting, the file's header, metadata and tensor table are walked within the file's
size, so a truncated or corrupt file is a :class:`GGUFError` naming the file and what does not fit.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import shutil
import socket
import struct
import sys
import tempfile
from pathlib import Path

from specheads.extras import install_hint

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # version 1 counted in 32 bits; transformers reads 2 and 3
MARKER = "specheads_gguf.json"


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
    """The transformers folder for a GGUF file, converting it on first use (each step said on stderr).

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
    weight_types = _check_layout(path)  # a bad file is named here, before any conversion work, not in the reader
    root.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(root, digest)
    staging = Path(tempfile.mkdtemp(prefix=f"{_staging_prefix(digest)}{os.getpid()}.", dir=root))
    staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the cache is shared like transformers' own
    _say(f"converting {path.name} into a transformers folder, {target} (once: later uses load that folder)")
    try:
        _convert(path, staging)
        record = {"source": str(path), "sha256": digest, "quantized": bool(weight_types - _PLAIN_TYPES)}
        (staging / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        if not _is_complete(target, digest):  # else another process finished the same file meanwhile
            if target.exists():  # an incomplete or stale folder from another conversion
                shutil.rmtree(target)
            os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _say(step: str) -> None:
    """One line on stderr about a conversion (once per file, but minutes for a 1.5B base: not a silent wait)."""
    print(f"specheads: {step}", file=sys.stderr, flush=True)


def _staging_prefix(digest: str) -> str:
    """``.<hash>.<host>-``: the temporary folders of this file's conversions on this machine (the pid follows)."""
    return f".{digest[:16]}.{re.sub(r'[^A-Za-z0-9_]', '_', socket.gethostname())}-"


def _remove_abandoned(root: Path, digest: str) -> None:
    """Delete the temporary folders that killed conversions of this file on this machine left behind.

    A folder whose process is still running (another conversion under way) is kept; so is every folder where a
    process cannot be probed without side effects (``os.kill(pid, 0)`` terminates it on Windows).
    """
    if os.name != "posix":
        return
    prefix = _staging_prefix(digest)
    for folder in root.glob(f"{prefix}*"):
        pid = folder.name[len(prefix) :].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _is_complete(folder: Path, digest: str) -> bool:
    marker = folder / MARKER
    if not marker.is_file() or not (folder / "config.json").is_file():
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
        raise GGUFError(f"reading {path} needs the gguf package: {install_hint('gguf')}") from None


# GGUF metadata value types: the fixed-size ones by struct format, then string (8) and array (9).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Reads a GGUF file front to back; a read past its end, or a malformed field, is a :class:`GGUFError`."""

    def __init__(self, data: mmap.mmap, path: Path) -> None:
        self.data, self.path, self.pos = data, path, 0

    def take(self, count: int, what: str) -> int:
        """Step over ``count`` bytes of ``what`` and return where they start."""
        start, size = self.pos, len(self.data)
        if start + count > size:
            raise GGUFError(
                f"{self.path} is truncated or corrupt: {what} needs bytes {start}..{start + count} but the file has "
                f"{size} bytes"
            )
        self.pos += count
        return start

    def unpack(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str, decode: bool = True) -> str | None:
        start = self.take(self.unpack("<Q", f"the length of {what}"), what)
        if not decode:
            return None
        try:
            return self.data[start : self.pos].decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path} is corrupt: {what} at byte {start} is not UTF-8 text") from None

    def value(self, kind: int, what: str, decode: bool = False, depth: int = 0):
        """One metadata value (an array is stepped over and read as None)."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], what)
        if kind == _STRING:
            return self.string(what, decode)
        if kind == _ARRAY and depth < 4:
            element, count = self.unpack("<I", f"the element type of {what}"), self.unpack("<Q", f"the size of {what}")
            if element in _SCALARS:
                self.take(count * struct.calcsize(_SCALARS[element]), what)
            elif element == _STRING:  # a vocabulary: 50k-250k strings, stepped over in a tight loop
                label = f"an element of {what}"
                for _ in range(count):
                    self.take(self.unpack("<Q", label), label)
            else:  # each element takes at least 12 bytes, so a corrupt count runs out of file quickly
                for _ in range(count):
                    self.value(element, f"an element of {what}", depth=depth + 1)
            return None
        raise GGUFError(f"{self.path} is corrupt: {what} has value type {kind}, which GGUF does not define here")


_PLAIN_TYPES = frozenset({0, 1, 30})  # ggml F32, F16, BF16: every other tensor type is a quantized one


def was_quantized(folder: str | Path) -> bool | None:
    """Whether the GGUF file a converted folder came from held quantized weights (None: not a converted folder).

    Folders converted before this was recorded are answered from their source file when it is still there, else
    taken as quantized (what almost every published GGUF file is)."""
    marker = Path(folder).expanduser() / MARKER
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if "quantized" in record:
        return bool(record["quantized"])
    source = Path(record.get("source", ""))
    try:
        return bool(_check_layout(source) - _PLAIN_TYPES) if source.is_file() else True
    except (GGUFError, ImportError):
        return True


def _check_layout(path: Path) -> set[int]:
    """Walk the header, metadata and tensor table and check that every tensor's data lies inside the file; returns
    the ggml types of its tensors."""
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data, path)
        cursor.take(4, "the magic")
        version = cursor.unpack("<I", "the version")
        if version not in GGUF_VERSIONS:
            swapped = " (a big-endian file, which transformers cannot read)" if version >> 24 in GGUF_VERSIONS else ""
            raise GGUFError(f"{path} is GGUF version {version}{swapped}; only versions 2 and 3 can be read")
        tensor_count, key_count = cursor.unpack("<Q", "the tensor count"), cursor.unpack("<Q", "the key count")
        wanted = {"general.architecture": None, "general.alignment": 32}
        for index in range(key_count):
            key = cursor.string(f"metadata key {index}")
            kind = cursor.unpack("<I", f"the type of metadata {key!r}")
            value = cursor.value(kind, f"metadata {key!r}", decode=key in wanted)
            if key in wanted:
                wanted[key] = value
        if not isinstance(wanted["general.architecture"], str):
            raise GGUFError(f"{path} has no general.architecture in its metadata")
        data_end, last, kinds = _tensor_table_end(cursor, tensor_count)
        alignment = wanted["general.alignment"] if isinstance(wanted["general.alignment"], int) else 32
        data_start = -(-cursor.pos // max(alignment, 1)) * max(alignment, 1)  # the table, rounded up to alignment
        if data_start + data_end > len(data):
            raise GGUFError(
                f"{path} is truncated: tensor {last!r} ends at byte {data_start + data_end} but the file has "
                f"{len(data)} bytes (an interrupted download or copy?)"
            )
    return kinds


def _tensor_table_end(cursor: _Cursor, tensor_count: int) -> tuple[int, str | None, set[int]]:
    """Read the tensor table: where the last tensor's data ends (from the start of the data), its name, and the
    ggml types of the tensors."""
    from gguf.constants import GGML_QUANT_SIZES

    data_end, last, kinds = 0, None, set()
    for index in range(tensor_count):
        name = cursor.string(f"the name of tensor {index}")
        rank = cursor.unpack("<I", f"the rank of tensor {name!r}")
        dims = [cursor.unpack("<Q", f"the shape of tensor {name!r}") for _ in range(rank)]
        kind = cursor.unpack("<I", f"the type of tensor {name!r}")
        offset = cursor.unpack("<Q", f"the offset of tensor {name!r}")
        if kind not in GGML_QUANT_SIZES:
            raise GGUFError(
                f"{cursor.path}: tensor {name!r} has ggml type {kind}, which the installed gguf package does not know"
            )
        kinds.add(kind)
        block, block_bytes = GGML_QUANT_SIZES[kind]
        elements = 1
        for dim in dims:
            elements *= dim
        end = offset + elements // block * block_bytes
        if end > data_end:
            data_end, last = end, name
    return data_end, last, kinds


def _convert(path: Path, out_dir: Path) -> None:
    """Dequantize ``path`` with transformers and save the plain model, tokenizer and generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, name = str(path.parent), path.name
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers warns about every GGUF load; the conversion happens once
    try:
        _say("dequantizing the tensors to float32")  # transformers' own bar follows
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        _say("reading the tokenizer")
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
    _say("saving the float32 model")
    plain.save_pretrained(out_dir)
    tokenizer.model_max_length = getattr(config, "max_position_embeddings", tokenizer.model_max_length)
    tokenizer.save_pretrained(out_dir)
