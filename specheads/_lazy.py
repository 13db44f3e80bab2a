"""PEP 562 lazy exports: a package names its public objects and imports each on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a public name to the module defining it; a name
    is imported on first access and then kept in ``namespace`` (the package's globals)."""

    def get(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    def listing() -> list[str]:
        return sorted([*namespace, *exports])

    return get, listing
