"""Heads shipped beside a named base's default (``heads="default:<variant>"``): found, hash-checked, and the set
llama.cpp's checks use where the default cannot run there. Uses a temporary assets folder, no real weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from specheads import assets
from specheads.heads.loading import heads_path

BASE = "smollm2-135m"


def _ship(root: Path, folders: list[str]) -> None:
    files = {}
    for folder in folders:
        (root / BASE / folder).mkdir(parents=True)
        path = root / BASE / folder / "config.json"
        path.write_text(json.dumps({"folder": folder}))
        files[f"{folder}/config.json"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (root / BASE / "manifest.json").write_text(json.dumps({"files": files}))


def test_a_variant_is_named_default_colon_variant_and_the_default_stays_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assets, "ASSETS_DIR", tmp_path)
    _ship(tmp_path, ["eagle3", "eagle3-llamacpp"])
    assert assets.heads_variants(BASE) == ["llamacpp"]
    assert Path(heads_path("default", BASE)) == tmp_path / BASE / "eagle3"
    assert Path(heads_path("default:llamacpp", BASE)) == tmp_path / BASE / "eagle3-llamacpp"
    assert assets.llamacpp_heads(BASE) == tmp_path / BASE / "eagle3-llamacpp"
    with pytest.raises(assets.MissingAssetsError, match="its variants: default:llamacpp"):
        heads_path("default:v0", BASE)
    assert heads_path("runs/x/heads", BASE) == "runs/x/heads"


def test_without_a_llamacpp_variant_llamacpp_uses_the_default_heads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assets, "ASSETS_DIR", tmp_path)
    _ship(tmp_path, ["eagle3"])
    assert assets.heads_variants(BASE) == []
    assert assets.llamacpp_heads(BASE) == tmp_path / BASE / "eagle3"
    with pytest.raises(assets.MissingAssetsError, match="its variants: none"):
        assets.shipped_heads(BASE, "llamacpp")


def test_a_variant_file_that_does_not_match_the_manifest_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assets, "ASSETS_DIR", tmp_path)
    _ship(tmp_path, ["eagle3", "eagle3-llamacpp"])
    (tmp_path / BASE / "eagle3-llamacpp" / "config.json").write_text("{}")
    with pytest.raises(assets.MissingAssetsError, match="does not match its manifest hash"):
        assets.shipped_heads(BASE, "llamacpp")
