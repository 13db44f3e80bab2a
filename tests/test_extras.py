"""The pip command for a missing optional dependency fits how specheads is installed: the extra of an installed
wheel, the checkout's extra (``pip install -e``) from a source checkout, and the package's own name in both."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

import specheads
from specheads import extras


def _extras_copied_into(root: Path, pyproject: str | None):  # noqa: ANN202 - the module
    """specheads/extras.py copied into ``root/specheads/`` (with ``pyproject`` beside the folder, when given) and
    imported from there."""
    (root / "specheads").mkdir(parents=True)
    if pyproject is not None:
        (root / "pyproject.toml").write_text(pyproject)
    shutil.copy(extras.__file__, root / "specheads" / "extras.py")
    spec = importlib.util.spec_from_file_location("copied_extras", root / "specheads" / "extras.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_checkout_is_told_from_an_installed_wheel(tmp_path) -> None:
    root = Path(specheads.__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file():  # these tests run from a checkout (editable install or PYTHONPATH)
        assert extras.source_checkout() == root
    assert _extras_copied_into(tmp_path / "site-packages", None).source_checkout() is None
    other = '[project]\nname = "someone-else"\n'
    assert _extras_copied_into(tmp_path / "vendored", other).source_checkout() is None
    ours = '[project]\nname = "specheads"\n'
    assert _extras_copied_into(tmp_path / "clone", ours).source_checkout() == tmp_path / "clone"


def test_an_installed_wheel_names_its_extra_and_the_package(monkeypatch) -> None:
    monkeypatch.setattr(extras, "source_checkout", lambda: None)
    assert extras.install_hint("gguf") == 'pip install "specheads[gguf]"  (or: pip install gguf)'
    assert extras.install_hint("matplotlib") == 'pip install "specheads[plot]"  (or: pip install matplotlib)'


def test_a_checkout_names_its_own_extra_from_where_the_user_is(monkeypatch, tmp_path) -> None:
    checkout = tmp_path / "specheads-clone"
    checkout.mkdir()
    monkeypatch.setattr(extras, "source_checkout", lambda: checkout)
    monkeypatch.chdir(checkout)
    assert extras.install_hint("gguf") == 'pip install -e ".[gguf]"  (or: pip install gguf)'
    monkeypatch.chdir(tmp_path)
    assert extras.install_hint("peft") == f'pip install -e "{checkout}[train]"  (or: pip install peft)'


def test_a_core_dependency_is_named_alone() -> None:
    assert extras.install_hint("accelerate") == "pip install accelerate"


@pytest.mark.parametrize("module", sorted(extras.EXTRAS))
def test_every_extra_named_is_one_pyproject_declares_with_that_package(module) -> None:
    root = Path(specheads.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        pytest.skip("needs the source checkout's pyproject.toml")
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extra, package = extras.EXTRAS[module]
    declared = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    assert any(requirement.split(">")[0].split("=")[0].split("<")[0] == package for requirement in declared)
