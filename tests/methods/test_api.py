"""The method API split by phase: loading heads and decoding with them import nothing of training or export."""

from __future__ import annotations

import subprocess
import sys

from specheads.methods import api, api_decode, api_export, api_train
from specheads.registry import HEAD_TYPES

PHASES = (api_decode, api_train, api_export)


def _loaded_after_importing(modules: list[str]) -> list[str]:
    """The names in ``sys.modules`` of a fresh interpreter once it has imported ``modules``."""
    code = f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\nprint(*sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_heads_drafters_and_the_decoder_import_nothing_of_training_or_export() -> None:
    parts = {path.partition(":")[0] for method in HEAD_TYPES.values() for path in (method.module, method.drafter)}
    modules = sorted({"specheads.inference.decoder", "specheads.methods.api_decode", *parts})
    loaded = _loaded_after_importing(modules)
    assert set(modules) <= set(loaded)
    assert [name for name in loaded if name.startswith(("specheads.training", "specheads.export"))] == []


def test_the_facade_is_the_three_phases_each_name_in_one() -> None:
    names = [name for phase in PHASES for name in phase.__all__]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)
    assert sorted(api.__all__) == sorted(names)
    for phase in PHASES:
        assert all(getattr(api, name) is getattr(phase, name) for name in phase.__all__), phase.__name__
