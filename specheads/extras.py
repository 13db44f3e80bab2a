"""The pip command that installs an optional dependency, worded for how this copy of specheads is installed.

``pip install "specheads[gguf]"`` works for an installed wheel; from a source checkout (an editable install, or the
tree on ``sys.path``) the extra is installed from the checkout, ``pip install -e ".[gguf]"``. Either way the package
itself is named as well, which works everywhere. Standard library only: the CLI reads it for its errors.
"""

from __future__ import annotations

import os
from pathlib import Path

# Dependencies a command may find missing, by import name: the extra of pyproject.toml that installs each (None: a
# dependency of specheads itself, missing from a broken install), and its pip name.
EXTRAS = {
    "accelerate": (None, "accelerate"),
    "datasets": (None, "datasets"),
    "peft": ("train", "peft"),
    "wandb": ("train", "wandb"),
    "matplotlib": ("plot", "matplotlib"),
    "gguf": ("gguf", "gguf"),
}


def source_checkout() -> Path | None:
    """The source checkout this specheads runs from (its ``pyproject.toml`` beside the package folder), None for an
    installed wheel."""
    root = Path(__file__).resolve().parents[1]
    try:
        return root if 'name = "specheads"' in (root / "pyproject.toml").read_text() else None
    except OSError:
        return None


def install_hint(module: str) -> str:
    """The pip command that installs the dependency ``module`` (a key of :data:`EXTRAS`), e.g.
    ``pip install "specheads[gguf]"  (or: pip install gguf)``; from a checkout, ``pip install -e ".[gguf]"`` (the
    checkout's path in place of ``.`` when the current directory is elsewhere)."""
    extra, package = EXTRAS[module]
    if extra is None:
        return f"pip install {package}"
    checkout = source_checkout()
    if checkout is None:
        return f'pip install "specheads[{extra}]"  (or: pip install {package})'
    where = "." if Path(os.getcwd()).resolve() == checkout else str(checkout)
    return f'pip install -e "{where}[{extra}]"  (or: pip install {package})'
