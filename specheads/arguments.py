"""Argument types and choices shared by the command line (:mod:`specheads.cli`) and the training entry point
(:mod:`specheads.train`), kept apart so that neither imports the other."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Literal

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (0 or a negative count is an error, never silently something else)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def positive_int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers >= 1, e.g. ``"1,3,5"`` (empty items ignored). An error names the
    item at fault and shows the form, after argparse's ``argument --flag:``."""
    values = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            value = int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not an integer (e.g. 1,3,5)") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{value} is not an integer >= 1 (e.g. 1,3,5)")
        values.append(value)
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 (e.g. 1,3,5), got {text!r}")
    return values


def check_output_path(
    path: str | Path, kind: Literal["directory", "file"], flag: str = "--out", staged: bool = False
) -> Path:
    """Refuse an output ``path`` that cannot be written, in one line naming ``flag``, before any work is done.

    ``kind`` is what the command writes there: a ``"directory"`` (written into; created with its parents when
    missing) or a ``"file"`` (created, or appended to when it exists). Refused: a file where a directory is wanted and
    a directory where a file is wanted, a missing path below a file, and a path this user cannot write or create
    (a read-only parent). ``staged``: the output is written beside ``path`` and renamed into place (export), so the
    parent must be writable even when ``path`` exists. Returns ``path`` as a ``Path``.

    Raises:
        ValueError: ``path`` cannot be written as ``kind``.
    """
    out = Path(path)
    if os.path.exists(out):
        is_directory = os.path.isdir(out)
        if is_directory != (kind == "directory"):
            raise ValueError(f"{flag} {out} is a {'directory' if is_directory else 'file'}; give a {kind}")
        if not os.access(out, os.W_OK | (os.X_OK if is_directory else 0)):
            raise ValueError(f"{flag} {out} is not writable")
        if not staged:
            return out
    existing = next(parent for parent in out.absolute().parents if os.path.exists(parent))  # "/" always exists
    if not os.path.isdir(existing):
        raise ValueError(f"{flag} {out} cannot be created: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {out} cannot be created: {existing} is not writable")
    return out
