"""The method folders type-check against the contract they implement: the registry's protocols for each part an
entry names (writers, readers, checkers, evaluations) and the method API's own annotations (mypy, configured in
pyproject.toml's ``[tool.mypy]``)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="needs mypy (the dev extra)")
def test_the_method_folders_type_check(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    checked = int(re.search(r"no issues found in (\d+) source files", done.stdout).group(1))
    assert checked == len(list((ROOT / "specheads" / "methods").rglob("*.py"))), done.stdout  # every method file
