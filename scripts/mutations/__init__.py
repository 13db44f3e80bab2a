"""The mutations of ``scripts/mutation_check.py``, one module a place of the code (each defines ``MUTATIONS``).

A mutation is a class of plausible bug written as one exact snippet replacement: it must apply exactly once, so a
refactor that moves the code fails the check loudly instead of testing nothing. ``tests`` are the tests meant to
catch it (pytest node ids or files); ``env`` adds environment variables to their run; ``cpu_flags`` are the
``/proc/cpuinfo`` flags a CPU needs for the bug to do harm (a kernel choice of one CPU family): on a CPU without them
the mutation is reported as not applicable, not run.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cpu_flags: tuple[str, ...] = ()


def all_mutations() -> tuple[Mutation, ...]:
    """Every module's mutations, modules in name order; names must be unique."""
    found: list[Mutation] = []
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        found.extend(importlib.import_module(f"{__name__}.{module.name}").MUTATIONS)
    names = [m.name for m in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SystemExit(f"mutation names used twice: {duplicates}")
    return tuple(found)


def cpu_flags() -> set[str]:
    """This machine's CPU flags (empty where ``/proc/cpuinfo`` cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
