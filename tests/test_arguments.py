"""The command line's shared argument checks: an output path is refused only when it cannot be written; a
number or a list of numbers that is not one is refused while parsing, naming the flag and the values it takes."""

from __future__ import annotations

import argparse
import os

import pytest

from specheads.arguments import check_output_path


def test_an_output_path_that_can_be_written_is_accepted(tmp_path) -> None:
    (tmp_path / "results.jsonl").write_text("{}\n")
    (tmp_path / "empty").mkdir()
    assert check_output_path(tmp_path / "new" / "nested" / "report", "directory") == tmp_path / "new/nested/report"
    assert check_output_path(str(tmp_path / "new.jsonl"), "file") == tmp_path / "new.jsonl"
    assert check_output_path(tmp_path / "results.jsonl", "file") == tmp_path / "results.jsonl"  # appended to
    assert check_output_path(tmp_path / "empty", "directory", staged=True) == tmp_path / "empty"
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.jsonl").exists()  # a check writes nothing


@pytest.mark.parametrize("staged", [False, True])
def test_an_existing_output_of_the_other_kind_is_refused_naming_the_flag(tmp_path, staged: bool) -> None:
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(ValueError, match=r"^--report \S+a-file is a file; give a directory$"):
        check_output_path(tmp_path / "a-file", "directory", flag="--report", staged=staged)
    with pytest.raises(ValueError, match=r"^--out \S+ is a directory; give a file$"):
        check_output_path(tmp_path, "file", staged=staged)
    with pytest.raises(ValueError, match=r"a-file/x/y\.jsonl cannot be created: \S+a-file is a file, not a directory$"):
        check_output_path(tmp_path / "a-file" / "x" / "y.jsonl", "file", staged=staged)


def test_a_read_only_parent_is_refused_and_a_staged_output_needs_its_parent(tmp_path, monkeypatch) -> None:
    """os.access answers as for a user who may read but not write ``read-only`` (root may write anywhere)."""
    read_only = tmp_path / "read-only"
    (read_only / "empty").mkdir(parents=True)
    access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode, **kw: not (mode & os.W_OK and path == read_only) and access(path, mode, **kw)
    )
    with pytest.raises(ValueError, match=r"new cannot be created: \S+read-only is not writable$"):
        check_output_path(read_only / "new", "directory")
    assert check_output_path(read_only / "empty", "directory") == read_only / "empty"  # written into in place
    with pytest.raises(ValueError, match=r"empty cannot be created: \S+read-only is not writable$"):
        check_output_path(read_only / "empty", "directory", staged=True)  # renamed into place: needs the parent
    with pytest.raises(ValueError, match=r"^--out \S+read-only is not writable$"):
        check_output_path(read_only, "directory")


# ---------------------------------------------------------------------------------------- comma-separated integers
def test_a_list_of_integers_is_parsed_and_each_bad_item_is_named_with_the_form() -> None:
    from specheads.arguments import positive_int_list

    assert positive_int_list("1,3, 5,") == [1, 3, 5]
    for text, message in [
        ("1,x", "'x' is not an integer (e.g. 1,3,5)"),
        ("2.5", "'2.5' is not an integer (e.g. 1,3,5)"),
        ("3,0", "0 is not an integer >= 1 (e.g. 1,3,5)"),
        (" , ", "expected comma-separated integers >= 1 (e.g. 1,3,5), got ' , '"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError) as error:
            positive_int_list(text)
        assert str(error.value) == message


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--draft-k", "1,x"], "argument --draft-k: 'x' is not an integer (e.g. 1,3,5)"),
        (["bench", "--draft-k", "2,-1"], "argument --draft-k: -1 is not an integer >= 1 (e.g. 1,3,5)"),
        (["bench", "--batch-size", "1", "x"], "argument --batch-size: expected an integer >= 1, got 'x'"),
        (["distill", "--prompts", "p.jsonl", "--batch-size", "0"], "argument --batch-size: expected an integer >= 1"),
    ],
)
def test_a_bad_number_on_the_command_line_is_a_usage_error_naming_the_flag(argv, message, capsys) -> None:
    """Refused while parsing, before any model loads: one line with the flag and the values it takes, never
    Python's "invalid literal for int()"."""
    from specheads.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--base", "default", "--out", "o"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "invalid literal" not in err


def test_the_draft_k_default_is_parsed_like_a_given_value() -> None:
    from specheads.cli import build_parser

    args = build_parser().parse_args(["bench", "--base", "default", "--out", "o"])
    assert args.draft_k == [1, 3, 5, 8]
