"""The embedded default model: name resolution, manifest verification, and what a broken copy does."""

from __future__ import annotations

import hashlib
import json

import pytest

from specheads import assets


@pytest.fixture
def fake_default(tmp_path, monkeypatch):
    """A stand-in default folder with two files and a matching manifest."""
    root = tmp_path / "default"
    (root / "base").mkdir(parents=True)
    (root / "draft").mkdir()
    files = {"base/config.json": b'{"model_type": "llama"}', "draft/config.json": b'{"model_type": "llama"}'}
    for relative, content in files.items():
        (root / relative).write_bytes(content)
    manifest = {"files": {relative: hashlib.sha256(content).hexdigest() for relative, content in files.items()}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(assets, "DEFAULT_DIR", root)
    assets.manifest.cache_clear()
    assets.verify.cache_clear()
    yield root
    assets.manifest.cache_clear()
    assets.verify.cache_clear()


def test_names_resolve_to_verified_folders(fake_default) -> None:
    assert assets.resolve("default") == str(fake_default / "base")
    assert assets.resolve("default", role="draft") == str(fake_default / "draft")
    assert assets.resolve("default-draft") == str(fake_default / "draft")
    assert assets.resolve("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"


def test_a_modified_file_is_refused_not_retrained(fake_default) -> None:
    (fake_default / "base" / "config.json").write_bytes(b'{"model_type": "gpt2"}')
    with pytest.raises(assets.MissingAssetsError, match="does not match its manifest hash"):
        assets.resolve("default")


def test_a_missing_file_is_refused(fake_default) -> None:
    (fake_default / "draft" / "config.json").unlink()
    with pytest.raises(assets.MissingAssetsError, match="draft/config.json is missing"):
        assets.resolve("default", role="draft")


def test_a_missing_manifest_says_how_to_reproduce(fake_default) -> None:
    (fake_default / "manifest.json").unlink()
    with pytest.raises(assets.MissingAssetsError, match="pretrain_default.py"):
        assets.resolve("default")


def test_the_cli_reports_missing_assets_cleanly(fake_default, capsys) -> None:
    from specheads.cli import main

    (fake_default / "manifest.json").unlink()
    assert main(["generate", "--base", "default", "x"]) == 2
    assert "not installed" in capsys.readouterr().err
