"""The README's test command and CI's: run as written (with pytest pointed at a tiny folder), each passes when the
tests pass and fails when pytest collects no tests, so that neither can pass by testing nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTEST = "python -m pytest -q"


def readme_test_command() -> str:
    """The second bash block of the README: the install, the lint and the test suite."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    return blocks[1].strip()


def ci_test_command() -> str:
    """.ci/run's line that installs the development extras and runs the suite, without its ``|| exit 1``."""
    line = next(line for line in (ROOT / ".ci/run").read_text().splitlines() if f" {PYTEST}" in line)
    return line.removesuffix(" || exit 1")


def _run_tests_part(command: str, folder: Path) -> subprocess.CompletedProcess:
    """``command`` from its test run on (after the lint), with pytest run by this interpreter on ``folder``."""
    _, lint, tests = command.partition("ruff format --check . && ")
    assert lint and tests.count(PYTEST) == 1, command
    tests = tests.replace(PYTEST, f"{sys.executable} -m pytest -q -p no:cacheprovider {folder}")
    return subprocess.run(["bash", "-c", tests], cwd=folder, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", [readme_test_command, ci_test_command], ids=["readme", "ci"])
def test_the_test_command_passes_on_passing_tests_and_fails_when_none_are_collected(command, tmp_path) -> None:
    passing, empty = tmp_path / "passing", tmp_path / "empty"
    passing.mkdir()
    empty.mkdir()
    (passing / "test_one.py").write_text("def test_one():\n    assert True\n")
    ran = _run_tests_part(command(), passing)
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr
    nothing = _run_tests_part(command(), empty)
    assert nothing.returncode != 0 and "no tests ran" in nothing.stdout, nothing.stdout + nothing.stderr
