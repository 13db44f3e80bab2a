"""The embedded default model: a small code base model, its tokenizer and a draft model shipped in the package.

``"default"`` names the base, ``"default-draft"`` the draft model (``draft_model="default"`` also works). The files
are checked against the sha256 hashes in ``default/manifest.json`` before use, so a corrupted or partial copy is an
error rather than a silent retrain or a wrong benchmark.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent / "default"
ALIASES = {"default": "base", "default-base": "base", "default-draft": "draft"}
REPRODUCE = (
    "python scripts/pretrain_default.py tokenizer && python scripts/pretrain_default.py train && "
    "python scripts/pretrain_default.py export"
)


class MissingAssetsError(FileNotFoundError):
    """The embedded default model is missing or does not match its manifest."""


def resolve(name: str, role: str | None = None) -> str:
    """Map ``"default"`` names to the verified shipped folder; any other name is returned unchanged.

    Args:
        name: a model name, path or hub id.
        role: ``"base"`` or ``"draft"``; lets ``draft_model="default"`` mean the default draft model.
    """
    if name not in ALIASES:
        return name
    part = role if (name == "default" and role) else ALIASES[name]
    verify()
    return str(DEFAULT_DIR / part)


@lru_cache(maxsize=1)
def manifest() -> dict:
    """The parsed manifest of the embedded default model."""
    path = DEFAULT_DIR / "manifest.json"
    if not path.is_file():
        raise MissingAssetsError(
            f"the embedded default model is not installed ({path} is missing); reproduce it with: {REPRODUCE}"
        )
    return json.loads(path.read_text())


@lru_cache(maxsize=1)
def verify() -> None:
    """Check every shipped file against the manifest's sha256; raise :class:`MissingAssetsError` on a mismatch."""
    files = manifest().get("files", {})
    if not files:
        raise MissingAssetsError("the default model's manifest lists no files")
    for relative, expected in files.items():
        path = DEFAULT_DIR / relative
        if not path.is_file():
            raise MissingAssetsError(f"default model file {relative} is missing; reproduce it with: {REPRODUCE}")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected:
            raise MissingAssetsError(
                f"default model file {relative} does not match its manifest hash (got {digest[:12]}, expected "
                f"{expected[:12]}); reinstall specheads or reproduce the model with: {REPRODUCE}"
            )


def prompts_path() -> Path:
    """The shipped benchmark prompts, cut from held-out standard-library files."""
    path = DEFAULT_DIR / "prompts.jsonl"
    if not path.is_file():
        raise MissingAssetsError(f"the default benchmark prompts are missing ({path})")
    return path
