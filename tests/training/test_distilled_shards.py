"""scripts/distilled_shards.py: a distillation's answers kept as compressed shards rebuild the same training file."""

from __future__ import annotations

import json
import lzma

import pytest
from chat_helpers import chat_tokenizer
from helpers import load_script, tiny_model

from specheads.prompts import load_prompts
from specheads.training.distill import distill


def test_pack_then_unpack_gives_the_distill_file_back_byte_for_byte(tmp_path) -> None:
    script = load_script("distilled_shards")
    tokenizer = chat_tokenizer()
    tokenizer.save_pretrained(tmp_path / "base")
    chats = [[{"from": "human", "value": f"question {i} " * (i + 1)}] for i in range(7)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "conversations": c}) + "\n" for i, c in enumerate(chats)))
    distilled = tmp_path / "distilled.jsonl"
    loaded = load_prompts(prompts, tokenizer=tokenizer)
    distill(tiny_model("llama", seed=1), tokenizer, loaded[::-1], distilled, max_new_tokens=6, progress=False)

    assert script.pack(distilled, tmp_path / "shards", shard_size=3) == (7, 3)
    saved = [lzma.decompress(path.read_bytes()).decode() for path in sorted((tmp_path / "shards").iterdir())]
    assert [len(shard.splitlines()) for shard in saved] == [3, 3, 1]
    assert not any("question" in shard for shard in saved)  # the answers alone, no prompt text
    assert script.unpack(tmp_path / "shards", [prompts], str(tmp_path / "base"), tmp_path / "rebuilt.jsonl") == 7
    assert (tmp_path / "rebuilt.jsonl").read_bytes() == distilled.read_bytes()
    assert script.pack(distilled, tmp_path / "shards", shard_size=3) == (7, 0)  # unchanged shards stay as they are

    with distilled.open("a") as handle:  # the file grew at its end: only the last shard changes
        handle.write(json.dumps({"id": "q9", "response": "r", "provenance": {}}) + "\n")
    assert script.pack(distilled, tmp_path / "shards", shard_size=3) == (8, 1)


def test_unpack_names_answers_without_a_prompt(tmp_path) -> None:
    script = load_script("distilled_shards")
    chat_tokenizer().save_pretrained(tmp_path / "base")
    (tmp_path / "distilled.jsonl").write_text(json.dumps({"id": "gone", "response": "r", "provenance": {}}) + "\n")
    script.pack(tmp_path / "distilled.jsonl", tmp_path / "shards", shard_size=10)
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"id": "other", "prompt": "x"}) + "\n")
    with pytest.raises(SystemExit, match="1 saved answers have no prompt.*'gone'"):
        script.unpack(tmp_path / "shards", [tmp_path / "prompts.jsonl"], str(tmp_path / "base"), tmp_path / "o.jsonl")
    assert not (tmp_path / "o.jsonl").exists()


def test_multi_turn_answers_are_kept_and_rebuilt(tmp_path) -> None:
    script = load_script("distilled_shards")
    tokenizer = chat_tokenizer()
    tokenizer.save_pretrained(tmp_path / "base")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "a", "turns": ["one", "two"]}) + "\n" + json.dumps({"id": "b", "turns": ["x"]})
    )
    distilled = tmp_path / "distilled.jsonl"
    loaded = load_prompts(prompts, tokenizer=tokenizer)
    distill(tiny_model("llama", seed=1), tokenizer, loaded, distilled, max_new_tokens=5, progress=False, all_turns=True)
    assert script.pack(distilled, tmp_path / "shards", shard_size=10) == (2, 1)
    saved = [
        json.loads(line)
        for line in lzma.decompress((tmp_path / "shards" / "responses-00000.jsonl.xz").read_bytes()).splitlines()
    ]
    assert [sorted(s) for s in saved] == [["id", "provenance", "responses"], ["id", "provenance", "response"]]
    assert script.unpack(tmp_path / "shards", [prompts], str(tmp_path / "base"), tmp_path / "rebuilt.jsonl") == 2
    assert (tmp_path / "rebuilt.jsonl").read_bytes() == distilled.read_bytes()


def test_a_file_grown_from_first_turns_to_whole_conversations_unpacks_from_both_prompt_files(tmp_path) -> None:
    script = load_script("distilled_shards")
    tokenizer = chat_tokenizer()
    tokenizer.save_pretrained(tmp_path / "base")
    conversations = {"a": ["one", "two"], "b": ["three", "four"], "c": ["five"]}
    first = tmp_path / "first.jsonl"  # the first turns (sharegpt_prompts.py), then the same ids with two turns
    first.write_text(
        "".join(
            json.dumps({"id": i, "conversations": [{"from": "human", "value": t[0]}]}) + "\n"
            for i, t in conversations.items()
        )
    )
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(json.dumps({"id": i, "turns": t}) + "\n" for i, t in conversations.items()))
    distilled, model = tmp_path / "distilled.jsonl", tiny_model("llama", seed=1)
    distill(model, tokenizer, load_prompts(first, tokenizer=tokenizer)[:1], distilled, max_new_tokens=4, progress=False)
    distill(
        model,
        tokenizer,
        load_prompts(whole, tokenizer=tokenizer),
        distilled,
        max_new_tokens=4,
        progress=False,
        all_turns=True,
    )  # resumes: "a" keeps its first-turn answer, "b" and "c" are answered whole
    records = [json.loads(line) for line in distilled.read_text().splitlines()]
    assert [len(r["conversations"]) for r in records] == [2, 4, 2]
    script.pack(distilled, tmp_path / "shards", shard_size=10)
    assert script.unpack(tmp_path / "shards", [first, whole], str(tmp_path / "base"), tmp_path / "rebuilt.jsonl") == 3
    assert (tmp_path / "rebuilt.jsonl").read_bytes() == distilled.read_bytes()
    with pytest.raises(SystemExit, match="1 saved answers have no prompt.*'b \\(2 turns\\)'"):
        script.unpack(tmp_path / "shards", [first], str(tmp_path / "base"), tmp_path / "other.jsonl")
