"""The leak check: evaluation prompts never enter training data or distillation prompts."""

from __future__ import annotations

import json

import pytest

from specheads.contamination import NGRAM, EvaluationIndex, evaluation_index, installed_sets, prompt_texts, words

QUESTION = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends "
    "every day with four."
)


def index_of(*texts: str) -> EvaluationIndex:
    index = EvaluationIndex()
    index.add("evalset", texts)
    return index


def test_a_copy_inside_longer_text_matches_whatever_its_case_spacing_and_punctuation():
    index = index_of(QUESTION)
    copied = "Please help: JANET'S ducks   lay 16 eggs, per day; she eats three for breakfast every morning!! Thanks"
    assert index.match(["unrelated text", copied]) == "evalset"


def test_a_run_shorter_than_the_ngram_does_not_match():
    index = index_of(QUESTION)
    tokens = words(QUESTION)
    assert index.match([" ".join(tokens[: NGRAM - 1])]) is None
    assert index.match([" ".join(tokens[:NGRAM])]) == "evalset"
    assert index.match([" ".join(tokens[1 : NGRAM + 1])]) == "evalset"  # any window, not only the start


def test_a_short_prompt_matches_only_as_the_whole_text():
    index = index_of("What is the capital of France?")
    assert index.match(["what is the capital of france"]) == "evalset"
    assert index.match(["What is the capital of France? And of Spain?"]) is None


def test_prompt_texts_reads_every_record_shape_and_only_user_turns():
    record = {
        "prompt": "raw",
        "turns": ["first", "second"],
        "conversations": [{"from": "human", "value": "asked"}, {"from": "gpt", "value": "answered"}],
        "messages": [{"role": "user", "content": "user said"}, {"role": "assistant", "content": "model said"}],
    }
    assert sorted(prompt_texts(record)) == sorted(["raw", "first", "second", "asked", "user said"])


def test_every_user_turn_is_screened_on_both_sides():
    """Evaluation sets ask follow-ups (MT-Bench's second turns are prompts too) and chats copy them in any user turn:
    an index of a two-turn record knows its second turn, and a conversation whose later user turn copies it matches,
    in either conversation shape."""
    follow_up = "Now rewrite your answer as a limerick about a lighthouse keeper who counts each passing ship at night."
    index = EvaluationIndex()
    index.add("evalset", prompt_texts({"turns": ["What is two plus two?", follow_up]}))
    sharegpt = [{"from": "human", "value": "Hello there"}, {"from": "gpt", "value": "Hi."}]
    sharegpt += [{"from": "human", "value": "Thanks! " + follow_up}, {"from": "gpt", "value": "Done."}]
    assert index.match(prompt_texts({"conversations": sharegpt})) == "evalset"
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    messages += [{"role": "user", "content": "And?"}, {"role": "assistant", "content": "Yes"}]
    messages += [{"role": "user", "content": follow_up.upper()}]
    assert index.match(prompt_texts({"messages": messages})) == "evalset"
    assert index.match(prompt_texts({"messages": messages[:-1]})) is None  # the copy, not the conversation, matches


def test_extra_files_are_indexed_and_a_missing_one_is_an_error(tmp_path):
    path = tmp_path / "bench.jsonl"
    own = "Write a limerick about a speculative decoder that drafts eight tokens and keeps every one of them"
    path.write_text(json.dumps({"id": "q", "turns": [own]}) + "\n")
    assert evaluation_index().match([own]) is None
    assert evaluation_index([path]).match([own]) == str(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        evaluation_index([tmp_path / "missing.jsonl"])


def test_the_shipped_prompt_files_are_always_in_the_index():
    from specheads.assets import prompts_path

    with open(prompts_path(), encoding="utf-8") as handle:
        first = prompt_texts(json.loads(handle.readline()))[0]
    assert evaluation_index().match([first]) == "specheads/default/prompts.jsonl"


@pytest.mark.parametrize("name", ["mt-bench", "humaneval", "gsm8k"])
def test_installed_evaluation_sets_are_indexed(name):
    sets = installed_sets()
    if name not in sets:
        pytest.skip(f"needs the {name} package (the test command installs it)")
    from specheads.contamination import _read_jsonl

    record = next(iter(_read_jsonl(sets[name])))
    assert evaluation_index().match(prompt_texts(record)[:1]) == name
