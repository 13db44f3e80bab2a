"""The test helpers that decide whether a test runs: an optional dependency is the package, not a folder named so."""

from __future__ import annotations

import sys

import pytest
from helpers import require

ENV = "SPECHEADS_TEST_REQUIRE_PROBE"


def test_a_folder_without_code_on_sys_path_is_a_missing_dependency(tmp_path, monkeypatch) -> None:
    """What pytest's prepend import mode does with ``tests/methods/dflash`` when z-lab's dflash is not installed."""
    (tmp_path / "specheads_probe_pkg").mkdir()
    (tmp_path / "specheads_probe_pkg" / "test_something.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^needs specheads_probe_pkg \(.*not the package\); install it"):
        require("specheads_probe_pkg", "pip install probe", strict_env=ENV)
    assert "specheads_probe_pkg" not in sys.modules  # the stand-in does not linger for later imports
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=rf"required here \({ENV}=1\)"):
        require("specheads_probe_pkg", "pip install probe", strict_env=ENV)
    with pytest.raises(pytest.fail.Exception, match="No module named 'specheads_absent_pkg'"):
        require("specheads_absent_pkg", "pip install probe", strict_env=ENV)


def test_an_installed_package_or_module_is_returned(tmp_path, monkeypatch) -> None:
    (tmp_path / "specheads_probe_real").mkdir()
    (tmp_path / "specheads_probe_real" / "__init__.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV, "1")
    try:
        assert require("specheads_probe_real", "pip install probe", strict_env=ENV).VALUE == 7
    finally:
        sys.modules.pop("specheads_probe_real", None)
    assert require("json", "", strict_env=ENV) is sys.modules["json"]
    assert require("sys", "", strict_env=ENV) is sys  # built in: no __file__, and still a real module
