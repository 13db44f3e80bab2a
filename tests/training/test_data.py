"""build_dataset: files -> fixed-length rows of input_ids, attention_mask and loss_mask."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chat_helpers import CHATML
from helpers import tiny_tokenizer

from specheads.training.config import DataConfig
from specheads.training.data import DataError, build_dataset
from specheads.training.files import eval_data

EOS, PAD = 1, 0


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_jsonl(path: Path, records: list) -> Path:
    return write(path, "".join(json.dumps(record) + "\n" for record in records))


def masked_spans(tokenizer, row: dict, mask: str = "loss_mask") -> list[str]:
    """The runs of consecutive tokens with ``row[mask] == 1``, decoded."""
    spans, current = [], []
    for token, flag in zip(row["input_ids"], row[mask], strict=True):
        if flag:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    return [tokenizer.decode(span) for span in spans]


# --------------------------------------------------------------------------------------------------- text and jsonl


def test_packing_cuts_exact_windows_across_documents(tmp_path, tokenizer):
    write(tmp_path / "a.txt", "abcdef")
    write(tmp_path / "b.txt", "ghijk")
    config = DataConfig(paths=[str(tmp_path)], format="text", max_length=4)
    rows = build_dataset(config, tokenizer)
    stream = ids(tokenizer, "abcdef") + [EOS] + ids(tokenizer, "ghijk") + [EOS]  # 13 tokens: 3 windows + 1 dropped
    assert len(rows) == 3
    assert [row["input_ids"] for row in rows] == [stream[0:4], stream[4:8], stream[8:12]]
    assert all(row["attention_mask"] == [1] * 4 and row["loss_mask"] == [1] * 4 for row in rows)


def test_documents_longer_than_the_model_window_do_not_warn(tmp_path, caplog):
    """Packing cuts long documents into windows: the tokenizer's "indexing errors" warning is noise there."""
    tokenizer = tiny_tokenizer()  # its own: the warning is given once per tokenizer object
    tokenizer.model_max_length = 16
    write(tmp_path / "long.txt", "abcdefgh" * 20)
    with caplog.at_level("WARNING"):
        rows = build_dataset(DataConfig(paths=[str(tmp_path)], format="text", max_length=8), tokenizer)
    assert len(rows) == 20
    assert "longer than the specified maximum sequence length" not in caplog.text


def test_folder_is_recursive_sorted_and_skips_hidden_and_binary(tmp_path, tokenizer):
    write(tmp_path / "b.md", "B")
    write(tmp_path / "a" / "z.py", "A")
    write(tmp_path / ".hidden", "H")
    write(tmp_path / ".git" / "config", "G")
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    config = DataConfig(paths=[str(tmp_path)], format="text", max_length=6, packing=False)
    rows = build_dataset(config, tokenizer)
    assert [tokenizer.decode(row["input_ids"], skip_special_tokens=True) for row in rows] == ["A", "B"]


def test_jsonl_text_field_without_packing_pads_and_truncates(tmp_path, tokenizer):
    write(
        tmp_path / "data.jsonl",
        json.dumps({"body": "abc", "text": "ignored"}) + "\n\n" + json.dumps({"body": "abcdefghij"}) + "\n",
    )
    config = DataConfig(paths=[str(tmp_path / "data.jsonl")], format="jsonl", text_field="body", max_length=6)
    config.packing = False
    rows = build_dataset(config, tokenizer)
    assert rows[0]["input_ids"] == ids(tokenizer, "abc") + [EOS, PAD, PAD]
    assert rows[0]["attention_mask"] == [1, 1, 1, 1, 0, 0]
    assert rows[0]["loss_mask"] == [1, 1, 1, 1, 0, 0]
    assert rows[1]["input_ids"] == ids(tokenizer, "abcdef")
    assert rows[1]["attention_mask"] == rows[1]["loss_mask"] == [1] * 6


def test_jsonl_folder_reads_only_jsonl_files(tmp_path, tokenizer):
    write_jsonl(tmp_path / "one.jsonl", [{"text": "one"}])
    write(tmp_path / "notes.txt", "not json")
    rows = build_dataset(DataConfig(paths=[str(tmp_path)], format="jsonl", max_length=8, packing=False), tokenizer)
    assert [tokenizer.decode(row["input_ids"], skip_special_tokens=True) for row in rows] == ["one"]


def test_limit_keeps_the_first_records(tmp_path, tokenizer):
    write_jsonl(tmp_path / "data.jsonl", [{"text": f"doc{i}"} for i in range(10)])
    config = DataConfig(paths=[str(tmp_path)], format="jsonl", max_length=8, packing=False, limit=3)
    rows = build_dataset(config, tokenizer)
    assert [tokenizer.decode(row["input_ids"], skip_special_tokens=True) for row in rows] == ["doc0", "doc1", "doc2"]


def test_heldout_split_is_disjoint_complete_and_deterministic(tmp_path, tokenizer):
    texts = [f"document {i}" for i in range(40)]
    write_jsonl(tmp_path / "data.jsonl", [{"text": text} for text in texts])
    config = DataConfig(paths=[str(tmp_path)], format="jsonl", max_length=16, packing=False, heldout_fraction=0.25)

    def decoded(split: str) -> list[str]:
        rows = build_dataset(config, tokenizer, split=split)
        return [tokenizer.decode(row["input_ids"], skip_special_tokens=True) for row in rows]

    train, heldout = decoded("train"), decoded("heldout")
    assert train and heldout
    assert not set(train) & set(heldout)
    assert sorted(train + heldout) == sorted(texts)
    assert decoded("train") == train and decoded("heldout") == heldout
    # The split depends on the record alone, not on its position: reversing the file keeps the held-out set.
    write_jsonl(tmp_path / "data.jsonl", [{"text": text} for text in reversed(texts)])
    assert sorted(decoded("heldout")) == sorted(heldout)


def test_same_inputs_give_same_rows(tmp_path, tokenizer):
    write(tmp_path / "a.txt", "the quick brown fox jumps over the lazy dog")
    config = DataConfig(paths=[str(tmp_path)], format="text", max_length=8)
    assert build_dataset(config, tokenizer).to_list() == build_dataset(config, tokenizer).to_list()


# ---------------------------------------------------------------------------------------------------- conversations

CONVERSATION = [
    {"from": "system", "value": "Be brief."},
    {"from": "human", "value": "Hello"},
    {"from": "gpt", "value": "Hi there."},
    {"from": "human", "value": "Bye"},
    {"from": "gpt", "value": "Bye."},
]
ROLES = {"system": "system", "human": "user", "gpt": "assistant"}
MESSAGES = [{"role": ROLES[turn["from"]], "content": turn["value"]} for turn in CONVERSATION]


def test_sharegpt_loss_mask_covers_exactly_assistant_content_and_end_marker(tmp_path, chat_tokenizer):
    write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CONVERSATION}])
    rows = build_dataset(DataConfig(paths=[str(tmp_path)], format="sharegpt", max_length=128), chat_tokenizer)
    (row,) = rows.to_list()
    assert masked_spans(chat_tokenizer, row) == ["Hi there.<|im_end|>", "Bye.<|im_end|>"]
    rendered = chat_tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    assert masked_spans(chat_tokenizer, row, "attention_mask") == [rendered]
    length = sum(row["attention_mask"])
    assert row["input_ids"][length:] == [PAD] * (128 - length)
    assert not any(row["loss_mask"][length:])


ANSWER_CHARACTERS = set("bcdfghklopqwxz")  # in no role header or end marker of the templates below
MULTI_TURN = [("system", "12"), ("user", "345"), ("assistant", "bdfh"), ("user", "6789"), ("assistant", "kop")]
MULTI_TURN += [("user", "90"), ("assistant", "qwxz"), ("user", "11"), ("assistant", "cgl")]
MULTI_TURN_TEMPLATES = {
    "chatml": CHATML,
    "plain": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}",
    "system-in-first-instruction": "{% for m in messages %}{% if m['role'] == 'system' %}[SYS] {{ m['content'] }} "
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% else %} {{ m['content'] }} [END]\n{% endif %}"
    "{% endfor %}",
}


@pytest.mark.parametrize("template", MULTI_TURN_TEMPLATES)
def test_every_assistant_turn_of_a_long_chat_is_a_target_and_no_user_or_system_token_is(
    tmp_path, chat_tokenizer, template
):
    """User and system contents are digits, answers letters that no header writes: every answer token is a target,
    no digit is, and each answer is its own span (its content, then the same end marker for every turn)."""
    conversation = [{"from": {"user": "human", "assistant": "gpt"}.get(role, role), "value": text}
                    for role, text in MULTI_TURN]  # fmt: skip
    write_jsonl(tmp_path / "chat.jsonl", [{"conversations": conversation}])
    config = DataConfig(
        paths=[str(tmp_path)], format="sharegpt", max_length=160, chat_template=MULTI_TURN_TEMPLATES[template]
    )
    (row,) = build_dataset(config, chat_tokenizer).to_list()
    tokens = [chat_tokenizer.decode([token]) for token in row["input_ids"]]
    flags = dict.fromkeys(row["loss_mask"][i] for i, token in enumerate(tokens) if token in ANSWER_CHARACTERS)
    assert list(flags) == [1]  # every answer token is a target
    assert not any(flag for token, flag in zip(tokens, row["loss_mask"], strict=True) if token.isdigit())
    answers = [text for role, text in MULTI_TURN if role == "assistant"]
    spans = masked_spans(chat_tokenizer, row)
    assert len(spans) == len(answers) and all(span.startswith(a) for span, a in zip(spans, answers, strict=True))
    assert len({span.removeprefix(answer) for span, answer in zip(spans, answers, strict=True)}) == 1


def test_sharegpt_role_content_json_list_matches_from_value_jsonl(tmp_path, chat_tokenizer):
    write_jsonl(tmp_path / "a" / "chat.jsonl", [{"conversations": CONVERSATION}])
    write(tmp_path / "b" / "chat.json", json.dumps([{"conversations": MESSAGES}], indent=2))
    first = build_dataset(DataConfig(paths=[str(tmp_path / "a")], format="sharegpt", max_length=96), chat_tokenizer)
    second = build_dataset(DataConfig(paths=[str(tmp_path / "b")], format="sharegpt", max_length=96), chat_tokenizer)
    assert first.to_list() == second.to_list()


def test_template_without_generation_prompt_keeps_the_header_out(tmp_path, chat_tokenizer):
    no_generation_prompt = CHATML.split("{% if")[0]
    write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CONVERSATION}])
    config = DataConfig(paths=[str(tmp_path)], format="sharegpt", max_length=128, chat_template=no_generation_prompt)
    (row,) = build_dataset(config, chat_tokenizer).to_list()
    assert masked_spans(chat_tokenizer, row) == ["Hi there.<|im_end|>", "Bye.<|im_end|>"]


def test_config_chat_template_file_overrides_the_tokenizers(tmp_path, chat_tokenizer):
    template = "{% for m in messages %}[{{ m['role'] }}]: {{ m['content'] }}\n{% endfor %}"
    template += "{% if add_generation_prompt %}[assistant]: {% endif %}"
    template_file = write(tmp_path / "template.jinja", template)
    write_jsonl(tmp_path / "data" / "chat.jsonl", [{"conversations": CONVERSATION}])
    config = DataConfig(
        paths=[str(tmp_path / "data")], format="sharegpt", max_length=128, chat_template=str(template_file)
    )
    (row,) = build_dataset(config, chat_tokenizer).to_list()
    assert tokenizer_text(chat_tokenizer, row).startswith("[system]: Be brief.\n[user]: Hello\n[assistant]: ")
    assert masked_spans(chat_tokenizer, row) == ["Hi there.", "Bye."]


def tokenizer_text(tokenizer, row: dict) -> str:
    return tokenizer.decode([t for t, a in zip(row["input_ids"], row["attention_mask"], strict=True) if a])


def test_rows_whose_targets_are_truncated_away_are_dropped(tmp_path, chat_tokenizer):
    long_prompt = [{"from": "human", "value": "x" * 50}, {"from": "gpt", "value": "ok"}]
    short = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ok"}]
    write_jsonl(tmp_path / "chat.jsonl", [{"conversations": long_prompt}, {"conversations": short}])
    rows = build_dataset(DataConfig(paths=[str(tmp_path)], format="sharegpt", max_length=32), chat_tokenizer)
    assert len(rows) == 1
    assert masked_spans(chat_tokenizer, rows[0]) == ["ok<|im_end|>"]


def test_template_that_is_not_prefix_stable_is_refused(tmp_path, chat_tokenizer):
    unstable = (
        "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CONVERSATION}])
    config = DataConfig(paths=[str(tmp_path)], format="sharegpt", max_length=128, chat_template=unstable)
    with pytest.raises(DataError, match=r"chat\.jsonl:1: the chat template is not prefix-stable"):
        build_dataset(config, chat_tokenizer)


# ------------------------------------------------------------------------------------------------------- bad inputs


def test_missing_path(tmp_path, tokenizer):
    with pytest.raises(DataError, match=r"data path .*nowhere\.txt does not exist"):
        build_dataset(DataConfig(paths=[str(tmp_path / "nowhere.txt")]), tokenizer)


def test_empty_folder(tmp_path, tokenizer):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"data folder .*empty holds no"):
        build_dataset(DataConfig(paths=[str(tmp_path / "empty")]), tokenizer)


def test_no_records(tmp_path, tokenizer):
    write(tmp_path / "blank.jsonl", "\n\n")
    with pytest.raises(DataError, match="no records found"):
        build_dataset(DataConfig(paths=[str(tmp_path)], format="jsonl"), tokenizer)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"data\.jsonl:3: not valid JSON"),
        ('["a list"]', r"data\.jsonl:3: each line must be a JSON object"),
        ('{"body": "x"}', r"data\.jsonl:3: no 'text' field"),
        ('{"text": 7}', r"data\.jsonl:3: field 'text' must be a string"),
    ],
)
def test_malformed_jsonl_line_names_file_and_line(tmp_path, tokenizer, line, message):
    write(tmp_path / "data.jsonl", '{"text": "fine"}\n\n' + line + "\n")
    with pytest.raises(DataError, match=message):
        build_dataset(DataConfig(paths=[str(tmp_path)], format="jsonl"), tokenizer)


@pytest.mark.parametrize(
    ("record", "cause"),
    [
        ({"text": "no turns"}, "1 without a 'conversations' list"),
        ({"conversations": [{"from": "robot", "value": "x"}]}, "1 with an unknown role ('robot' x1)"),
        ({"conversations": [{"from": "human"}]}, "1 with a non-string content"),
        ({"conversations": ["hello"]}, "1 with a turn that is not an object"),
    ],
)
def test_defective_sharegpt_record_is_skipped_and_counted(tmp_path, chat_tokenizer, caplog, record, cause):
    write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CONVERSATION}, record])
    with caplog.at_level("WARNING", logger="specheads.training"):
        rows = build_dataset(DataConfig(paths=[str(tmp_path)], format="sharegpt"), chat_tokenizer)
    assert len(rows) == 1
    assert f"sharegpt: 2 records read, 1 used; skipped: {cause}" in caplog.text


def test_sharegpt_record_that_is_not_an_object_names_file_and_line(tmp_path, chat_tokenizer):
    write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CONVERSATION}, ["a list"]])
    with pytest.raises(DataError, match=r"chat\.jsonl:2: a record must be a JSON object"):
        build_dataset(DataConfig(paths=[str(tmp_path)], format="sharegpt"), chat_tokenizer)


def test_sharegpt_json_list_names_the_record(tmp_path, chat_tokenizer):
    write(tmp_path / "chat.json", json.dumps([{"conversations": CONVERSATION}, "not a record"]))
    with pytest.raises(DataError, match=r"chat\.json: record 1: a record must be a JSON object"):
        build_dataset(DataConfig(paths=[str(tmp_path)], format="sharegpt"), chat_tokenizer)


def test_tokenizer_without_chat_template(tmp_path, tokenizer):
    write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CONVERSATION}])
    with pytest.raises(DataError, match="the tokenizer has none; set data.chat_template"):
        build_dataset(DataConfig(paths=[str(tmp_path)], format="sharegpt"), tokenizer)


def test_template_error_names_the_record(tmp_path, chat_tokenizer):
    strict = "{% for m in messages %}{% if 'Bye' in m['content'] %}{{ raise_exception('no goodbyes') }}{% endif %}"
    strict += "{{ m['content'] }}{% endfor %}"
    write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CONVERSATION[:3]}, {"conversations": CONVERSATION}])
    config = DataConfig(paths=[str(tmp_path)], format="sharegpt", chat_template=strict)
    with pytest.raises(DataError, match=r"chat\.jsonl:2: the chat template failed .*no goodbyes"):
        build_dataset(config, chat_tokenizer)


def test_empty_heldout_split_is_an_error(tmp_path, tokenizer):
    write(tmp_path / "a.txt", "abc")
    with pytest.raises(DataError, match="heldout_fraction is 0"):
        build_dataset(DataConfig(paths=[str(tmp_path)]), tokenizer, split="heldout")


@pytest.mark.parametrize("layout", ["packed", "padded", "conversations"])
def test_every_layout_gives_fixed_length_rows_of_compact_ints(tmp_path, chat_tokenizer, layout):
    if layout == "conversations":
        write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CONVERSATION}] * 2)
        config = DataConfig(paths=[str(tmp_path)], format="sharegpt", max_length=64)
    else:
        write_jsonl(tmp_path / "data.jsonl", [{"text": "abcdefghij"}] * 3)
        config = DataConfig(paths=[str(tmp_path)], format="jsonl", max_length=8, packing=layout == "packed")
    rows = build_dataset(config, chat_tokenizer)
    assert rows.column_names == ["input_ids", "attention_mask", "loss_mask"]
    assert [rows.features[c].feature.dtype for c in rows.column_names] == ["int32", "int8", "int8"]
    assert all(len(row[c]) == config.max_length for row in rows for c in rows.column_names)


def test_padding_falls_back_to_eos_without_a_pad_token(tmp_path):
    tokenizer = tiny_tokenizer()
    tokenizer.pad_token = None
    write(tmp_path / "a.txt", "ab")
    rows = build_dataset(DataConfig(paths=[str(tmp_path)], max_length=5, packing=False), tokenizer)
    assert rows[0]["input_ids"] == ids(tokenizer, "ab") + [EOS, EOS, EOS]
    assert rows[0]["attention_mask"] == [1, 1, 1, 0, 0]


# ---------------------------------------------------------------------------------------------------------- screening

LEAKED = (
    "Describe in three sentences how a lighthouse keeper on a windless island would spend the longest night of winter."
)


def chat(question: str, answer: str) -> dict:
    return {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]}


def test_records_copying_an_evaluation_prompt_or_repeating_one_are_dropped_and_counted(
    tmp_path, chat_tokenizer, caplog
):
    bench = write_jsonl(tmp_path / "bench" / "questions.jsonl", [{"id": 1, "turns": [LEAKED]}])
    records = [
        chat("Tell me a joke", "No."),
        chat("Please, " + LEAKED.upper() + " Thanks!", "Aloha."),  # a copy, however dressed up
        chat("Tell me a joke", "No."),  # an exact repeat
        chat("Tell me a joke", "Another answer."),  # the same question answered otherwise is another record
    ]
    write_jsonl(tmp_path / "data" / "chat.jsonl", records)
    config = DataConfig(paths=[str(tmp_path / "data")], format="sharegpt", max_length=64, exclude_prompts=[str(bench)])
    with caplog.at_level("WARNING"):
        rows = build_dataset(config, chat_tokenizer)
    assert len(rows) == 2
    assert "2 records dropped: 1 copy evaluation prompts (" in caplog.text and "questions.jsonl x1)" in caplog.text
    assert "; 1 repeat earlier records exactly" in caplog.text
    kept = DataConfig(
        paths=[str(tmp_path / "data")], format="sharegpt", max_length=256, decontaminate=False, deduplicate=False
    )
    assert len(build_dataset(kept, chat_tokenizer)) == 4


def test_a_chat_copying_an_evaluation_prompt_in_a_later_user_turn_is_dropped_and_counted(
    tmp_path, chat_tokenizer, caplog
):
    """The copy is the evaluation set's second turn (MT-Bench asks two) and the chat's third user turn."""
    bench = write_jsonl(tmp_path / "bench" / "questions.jsonl", [{"id": 1, "turns": ["What is 2 + 2?", LEAKED]}])
    turns = ["Hello", "Hi.", "Tell me a joke", "No.", "Thanks. " + LEAKED, "Aloha."]
    later = {"conversations": [{"from": ("human", "gpt")[i % 2], "value": text} for i, text in enumerate(turns)]}
    write_jsonl(tmp_path / "data" / "chat.jsonl", [chat("Tell me a joke", "No."), later, chat("Hello", "Hi.")])
    config = DataConfig(paths=[str(tmp_path / "data")], format="sharegpt", max_length=64, exclude_prompts=[str(bench)])
    with caplog.at_level("WARNING"):
        rows = build_dataset(config, chat_tokenizer)
    assert [masked_spans(chat_tokenizer, row) for row in rows] == [["No.<|im_end|>"], ["Hi.<|im_end|>"]]
    assert "1 records dropped: 1 copy evaluation prompts (" in caplog.text and "questions.jsonl x1)" in caplog.text


def test_held_out_chats_are_evaluated_although_training_excludes_their_prompts(tmp_path, chat_tokenizer) -> None:
    """A fixed held-out file whose prompts the recipe keeps out of training (data.exclude_prompts) is still read
    whole for evaluation: the exclusion list is about training chats, not these."""
    prompts = write_jsonl(tmp_path / "heldout_prompts.jsonl", [{"id": "h", "turns": [LEAKED]}])
    write_jsonl(tmp_path / "heldout.jsonl", [chat(LEAKED, "Aloha."), chat("Another held-out question", "Yes.")])
    write_jsonl(tmp_path / "train.jsonl", [chat("Tell me a joke", "No."), chat("Say: " + LEAKED, "Hi.")])
    config = DataConfig(
        paths=[str(tmp_path / "train.jsonl")], format="sharegpt", max_length=256, limit=1,
        eval_paths=[str(tmp_path / "heldout.jsonl")], exclude_prompts=[str(prompts)],
    )  # fmt: skip
    assert len(build_dataset(config, chat_tokenizer)) == 1  # the copy is dropped from training
    assert len(build_dataset(eval_data(config), chat_tokenizer)) == 2  # every held-out chat, whatever data.limit says


def test_documents_are_screened_too_and_the_limit_counts_kept_records(tmp_path, tokenizer):
    bench = write_jsonl(tmp_path / "bench.jsonl", [{"prompt": LEAKED}])
    write_jsonl(
        tmp_path / "data" / "docs.jsonl", [{"text": "doc0"}, {"text": LEAKED}, {"text": "doc0"}, {"text": "doc1"}]
    )
    config = DataConfig(
        paths=[str(tmp_path / "data")],
        format="jsonl",
        max_length=8,
        packing=False,
        limit=2,
        exclude_prompts=[str(bench)],
    )
    rows = build_dataset(config, tokenizer)
    assert [tokenizer.decode(row["input_ids"], skip_special_tokens=True) for row in rows] == ["doc0", "doc1"]


def test_limit_counts_records_of_the_split_and_the_heldout_split_does_not_move(tmp_path, tokenizer):
    write_jsonl(tmp_path / "data.jsonl", [{"text": f"document {i}"} for i in range(60)])

    def decoded(split: str, limit: int | None) -> list[str]:
        config = DataConfig(
            paths=[str(tmp_path)], format="jsonl", max_length=16, packing=False, heldout_fraction=0.25, limit=limit
        )
        return [
            tokenizer.decode(row["input_ids"], skip_special_tokens=True)
            for row in build_dataset(config, tokenizer, split)
        ]

    train, heldout = decoded("train", None), decoded("heldout", None)
    assert decoded("train", 5) == train[:5]
    assert decoded("heldout", 5) == heldout[:5]


def test_data_that_the_screening_drops_whole_is_a_clear_error(tmp_path, tokenizer):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "same"}, {"text": "same"}])
    bench = write_jsonl(tmp_path / "bench.jsonl", [{"prompt": "same"}])
    config = DataConfig(
        paths=[str(tmp_path / "data.jsonl")], format="jsonl", max_length=8, packing=False, exclude_prompts=[str(bench)]
    )
    with pytest.raises(DataError, match="all 2 records were dropped: 2 copy evaluation prompts"):
        build_dataset(config, tokenizer)
