"""The package installed from a wheel (not the repository checkout) finds everything it reads at run time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_wheel_install_generates_with_a_named_tree(tmp_path) -> None:
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    [wheel] = tmp_path.glob("specheads-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"specheads/trees/binary-7.json", "specheads/assets/default/eagle3/config.json"} <= names
    for manifest in sorted((ROOT / "specheads" / "assets").glob("*/manifest.json")):  # every shipped set of files
        folder = f"specheads/assets/{manifest.parent.name}"
        listed = {f"{folder}/{name}" for name in [*json.loads(manifest.read_text())["files"], "manifest.json"]}
        assert listed <= names, sorted(listed - names)[:5]
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    # Run from an empty folder with only the installed copy first on the path: the checkout cannot be read.
    env = {**os.environ, "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    code = (
        "import specheads, sys; from specheads.cli import main; "
        f"assert specheads.__file__.startswith({str(target)!r}), specheads.__file__; "
        "sys.exit(main(['generate', '--base', 'default', '--heads', 'default', '--tree', 'binary-7', "
        "'--max-new-tokens', '8', '--stats', 'def add(a, b):']))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "tau" in run.stdout + run.stderr


@pytest.mark.slow
def test_a_plain_install_in_a_fresh_venv_runs_the_demo(tmp_path) -> None:
    """The README's first command's install: torch, then the package without extras, in a venv of its own; the demo
    (which trains Medusa heads through the Accelerate trainer) then runs and every method matches greedy."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    for packages in (["torch==2.13.0"], [str(ROOT)]):
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *packages], capture_output=True, text=True, cwd=tmp_path
        )
        assert install.returncode == 0, install.stderr[-2000:]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # the demo's Medusa heads are cached per user (reused if they fit)
    env.pop("PYTHONPATH", None)
    demo = subprocess.run(
        [str(venv / "bin" / "specheads"), "demo", "--max-new-tokens", "32", "--threads", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert demo.returncode == 0, (demo.stdout[-2000:], demo.stderr[-2000:])
    assert "all texts identical: yes" in demo.stdout
