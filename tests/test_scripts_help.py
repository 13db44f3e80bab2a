"""Every script in scripts/ answers ``--help`` with its usage, exit 0, without importing torch, transformers or
numpy: the heavy imports come after the arguments are read (seconds of imports for a usage line otherwise)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))
HEAVY = ("torch", "transformers", "numpy")

# Runs each script as ``python SCRIPT --help`` would (as __main__, its folder first on sys.path), in one interpreter,
# and reports its exit code, what it printed and which heavy modules it had imported by then.
HARNESS = """
import contextlib, io, json, os, runpy, sys
heavy, results = sys.argv[1].split(","), {}
for path in sys.argv[2:]:
    sys.argv, saved_path, out = [path, "--help"], list(sys.path), io.StringIO()
    sys.path.insert(0, os.path.dirname(path))
    code = None
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as stop:
            code = stop.code
    sys.path[:] = saved_path
    results[os.path.basename(path)] = {
        "exit": code, "usage": out.getvalue(), "heavy": [name for name in heavy if name in sys.modules]
    }
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def helped() -> dict[str, dict]:
    """``{script name: {"exit", "usage", "heavy"}}``; heavy modules are those loaded by this script or one before it
    (the first script that imports one is named by its own entry)."""
    done = subprocess.run(
        [sys.executable, "-c", HARNESS, ",".join(HEAVY), *map(str, SCRIPTS)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 20 and {"pretrain_default.py", "bench_claims.py"} <= {path.name for path in SCRIPTS}


@pytest.mark.parametrize("script", [path.name for path in SCRIPTS])
def test_help_prints_the_usage_and_imports_nothing_heavy(helped, script) -> None:
    result = helped[script]
    assert result["exit"] == 0
    assert result["usage"].startswith(f"usage: {script}")
    assert result["heavy"] == [], f"{script} --help imported {result['heavy']}"
