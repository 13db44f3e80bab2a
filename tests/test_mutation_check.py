"""The mutation check counts a catch only when the tests fail because of the mutation."""

from __future__ import annotations

from pathlib import Path

from helpers import load_script

PACKAGE = "def double(x):\n    return 2 * x\n"
TESTS = {
    "test_good.py": "from pkg import double\n\n\ndef test_double():\n    assert double(3) == 6\n",
    "test_broken.py": "import not_installed_anywhere  # noqa: F401\n\n\ndef test_x():\n    assert True\n",
    "test_spaces.py": (
        "import pytest\nfrom pkg import double\n\n\n@pytest.mark.parametrize('x', [1], ids=['one two'])\n"
        "def test_double(x):\n    assert double(x) == 2\n"
    ),
}


def _tree(destination: Path) -> None:
    (destination / "pkg").mkdir(parents=True, exist_ok=True)
    (destination / "pkg" / "__init__.py").write_text(PACKAGE)
    for name, text in TESTS.items():
        (destination / name).write_text(text)


def _run(monkeypatch, tmp_path: Path, tests: tuple[str, ...], new: str = "    return 3 * x\n"):  # noqa: ANN202
    check = load_script("mutation_check")
    monkeypatch.setattr(check, "copy_tree", _tree)
    pristine = tmp_path / "pristine"
    _tree(pristine)
    mutation = check.Mutation("triple", "doubles triple", "pkg/__init__.py", "    return 2 * x\n", new, tests)
    return check.check_mutations([mutation], pristine, jobs=1, keep=False)[0]


def test_a_test_that_fails_because_of_the_mutation_is_a_catch(monkeypatch, tmp_path) -> None:
    verdict = _run(monkeypatch, tmp_path, ("test_good.py",))
    assert verdict.caught and "test_good.py::test_double" in verdict.detail


def test_a_test_that_fails_without_the_mutation_too_is_not_a_catch(monkeypatch, tmp_path) -> None:
    verdict = _run(monkeypatch, tmp_path, ("test_broken.py",))
    assert not verdict.caught and "WITHOUT" in verdict.detail


def test_a_mutation_no_test_notices_survives(monkeypatch, tmp_path) -> None:
    assert not _run(monkeypatch, tmp_path, ("test_good.py",), new="    return x + x\n").caught


def test_failing_ids_with_spaces_are_rerun_whole(monkeypatch, tmp_path) -> None:
    verdict = _run(monkeypatch, tmp_path, ("test_spaces.py",))
    assert verdict.caught and "test_spaces.py::test_double[one two]" in verdict.detail


def test_proofs_run_in_one_batch_keep_each_mutation_apart(monkeypatch, tmp_path) -> None:
    """Four mutations proven by one rerun on the unmutated tree: the one whose test also fails there is not a
    catch, the real ones are, and the survivor survives."""
    check = load_script("mutation_check")
    monkeypatch.setattr(check, "copy_tree", _tree)
    pristine = tmp_path / "pristine"
    _tree(pristine)
    old = "    return 2 * x\n"
    mutations = [
        check.Mutation("triple", "good test", "pkg/__init__.py", old, "    return 3 * x\n", ("test_good.py",)),
        check.Mutation("broken", "broken test", "pkg/__init__.py", old, "    return 3 * x\n", ("test_broken.py",)),
        check.Mutation("spaces", "spaced id", "pkg/__init__.py", old, "    return 4 * x\n", ("test_spaces.py",)),
        check.Mutation("same", "same function", "pkg/__init__.py", old, "    return x + x\n", ("test_good.py",)),
    ]
    runs = []
    real_run = check.subprocess.run
    monkeypatch.setattr(check.subprocess, "run", lambda command, **kw: runs.append(command) or real_run(command, **kw))
    verdicts = {verdict.mutation.name: verdict for verdict in check.check_mutations(mutations, pristine, 2, False)}
    assert [verdicts[name].caught for name in ("triple", "broken", "spaces", "same")] == [True, False, True, False]
    assert "WITHOUT" in verdicts["broken"].detail
    assert "test_spaces.py::test_double[one two]" in verdicts["spaces"].detail
    proofs = [command for command in runs if "pytest" in command and "-x" not in command]
    assert len(proofs) == 1  # one rerun on the unmutated tree for all of them
