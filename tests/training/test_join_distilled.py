"""scripts/join_distilled.py: one training file from several distill outputs, and a file that only grows at its end."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import load_script


def record(identifier: str, question: str) -> str:
    turns = [{"from": "human", "value": question}, {"from": "gpt", "value": f"answer to {question}"}]
    return json.dumps({"id": identifier, "conversations": turns})


def ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_join_keeps_the_first_of_each_id_and_first_turn_and_skips_torn_lines(tmp_path) -> None:
    join = load_script("join_distilled").join
    (tmp_path / "a.jsonl").write_text(
        "\n".join([record("a0", "Hi"), record("a1", "Why?"), '{"id": "a2", "conv']) + "\n"
    )
    (tmp_path / "b.jsonl").write_text("\n".join([record("a1", "Other"), record("b0", "  why? "), record("b1", "How")]))
    counts = join([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "out.jsonl")
    assert ids(tmp_path / "out.jsonl") == ["a0", "a1", "b1"]
    assert counts == {"kept": 3, "unreadable": 1, "repeated id": 1, "repeated first turn": 1}


def test_grow_keeps_the_existing_file_in_place_and_appends_only_new_records(tmp_path) -> None:
    join = load_script("join_distilled").join
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "out.jsonl"
    a.write_text(record("a0", "one") + "\n")
    b.write_text(record("b0", "two") + "\n")
    join([a, b], out, grow=True)
    assert ids(out) == ["a0", "b0"]
    # Both processes wrote more; a plain join would put a1 before b0 and move every later row.
    a.write_text("\n".join([record("a0", "one"), record("a1", "three")]) + "\n")
    b.write_text("\n".join([record("b0", "two"), record("b1", "four")]) + "\n")
    join([a, b], tmp_path / "plain.jsonl")
    assert ids(tmp_path / "plain.jsonl") == ["a0", "a1", "b0", "b1"]
    counts = join([a, b], out, grow=True)
    assert ids(out) == ["a0", "b0", "a1", "b1"]
    assert counts == {"already in out": 2, "kept": 2, "repeated id": 2}
