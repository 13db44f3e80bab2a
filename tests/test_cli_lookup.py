"""``--prompt-lookup`` on the command line: generate composes it with any method; bench adds a ``<row>+lookup`` row
next to each specheads row, which ``--methods`` names (or a heads label's ``<label>+lookup``), every row exact."""

from __future__ import annotations

import json

import pytest
from helpers import tiny_model, tiny_tokenizer

from specheads.bench import build_methods
from specheads.cli import main
from specheads.heads import MedusaHeads


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookup-cli")
    for name, kwargs in {"base": dict(seed=1), "draft": dict(seed=2, hidden=16, layers=1)}.items():
        tiny_model("llama", **kwargs).save_pretrained(root / name)
        tiny_tokenizer().save_pretrained(root / name)
    MedusaHeads.from_base(tiny_model("llama", seed=1), num_heads=2).save_pretrained(root / "medusa")
    (root / "prompts.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt": f"x = {i}\ny = x\nx = {i}\ny ="}) + "\n" for i in range(2))
    )
    return root


@pytest.mark.parametrize("method", [["--method", "none"], ["--draft-model", "draft"], ["--heads", "medusa"]])
def test_generate_composes_lookup_with_the_method_and_prints_the_same_text(models, method, capsys) -> None:
    method = [method[0], str(models / method[1]) if method[0] != "--method" else method[1]]
    generate = ["generate", "--base", str(models / "base"), "--max-new-tokens", "16", *method]
    assert main([*generate, "--json", "x = 1\ny = x\nx = 1\ny ="]) == 0
    alone = json.loads(capsys.readouterr().out)["new_tokens"]
    assert main([*generate, "--json", "--prompt-lookup", "x = 1\ny = x\nx = 1\ny ="]) == 0
    assert json.loads(capsys.readouterr().out)["new_tokens"] == alone
    assert main([*generate, "--stats", "--prompt-lookup", "x = 1"]) == 0
    assert "+lookup]" in capsys.readouterr().err  # the drafter's name: "[none+lookup] ...", "[draft+lookup] ..."


def test_bench_adds_a_lookup_row_next_to_each_specheads_row_and_methods_names_them(models) -> None:
    from transformers import AutoModelForCausalLM

    from specheads.heads import load_heads

    base = AutoModelForCausalLM.from_pretrained(models / "base").eval()
    draft = AutoModelForCausalLM.from_pretrained(models / "draft").eval()
    heads = [("medusa", load_heads(models / "medusa", base))]
    trees = {"medusa": ["chain-1", "chain-2"]}

    def names(**options) -> list[str]:
        return [m.name for m in build_methods(base, draft, draft_ks=(2,), heads=heads, trees=trees, **options)]

    plain = names()
    assert not any(name.endswith("+lookup") for name in plain)
    every = names(prompt_lookup=True)
    assert [name for name in every if not name.endswith("+lookup")] == plain
    for row in ("none", "draft-k2", "draft-adaptive", "medusa-chain-1", "medusa-chain-2"):
        assert every[every.index(row) + 1] == f"{row}+lookup"
    assert "prompt-lookup+lookup" not in every
    assert names(prompt_lookup=True, only=["medusa+lookup"]) == [
        "hf-greedy",
        "medusa-chain-1+lookup",
        "medusa-chain-2+lookup",
    ]
    assert names(prompt_lookup=True, only=["medusa"]) == ["hf-greedy", "medusa-chain-1", "medusa-chain-2"]
    assert names(prompt_lookup=True, only=["none+lookup", "draft-adaptive+lookup", "draft-k2"]) == [
        "hf-greedy",
        "none+lookup",
        "draft-k2",
        "draft-adaptive+lookup",
    ]
    with pytest.raises(ValueError, match="unknown bench methods"):
        names(only=["none+lookup"])


def test_bench_lookup_rows_are_exact_and_report_their_spread_as_none_does(models, tmp_path) -> None:
    out = tmp_path / "bench"
    argv = ["bench", "--base", str(models / "base"), "--prompts", str(models / "prompts.jsonl"), "--out", str(out)]
    argv += ["--max-new-tokens", "16", "--heads", str(models / "medusa"), "--trees", "medusa=chain-1"]
    assert main([*argv, "--methods", "none,none+lookup,medusa+lookup"]) == 0  # a +lookup name implies the flag
    rows = {row["name"]: row for row in json.loads((out / "report.json").read_text())["methods"]}
    assert list(rows) == ["hf-greedy", "none", "none+lookup", "medusa-chain-1+lookup"]
    assert all(row["matches_greedy"] for row in rows.values())
    for name in ("none", "none+lookup"):
        low, high = rows[name]["speedup_per_prompt_iqr"]
        assert low <= rows[name]["speedup_per_prompt_median"] <= high
    assert rows["none+lookup"]["mean_accepted_length"] > 1.0  # the repeated lines were copied
    assert "| none+lookup |" in (out / "report.md").read_text()


def test_generate_and_bench_rows_read_a_lookup_corpus(models, tmp_path, capsys) -> None:
    """``--lookup-corpus`` (implying ``--prompt-lookup``) puts the corpus in the lookup's index: a corpus holding the
    answer carries more tokens a step, and the text stays the same."""
    import torch
    from transformers import AutoModelForCausalLM

    generate = ["generate", "--base", str(models / "base"), "--max-new-tokens", "24", "--method", "none", "--json"]
    prompt = "q = 7; r"
    assert main([*generate, "--prompt-lookup", prompt]) == 0
    alone = json.loads(capsys.readouterr().out)
    corpus = tmp_path / "answers.jsonl"
    corpus.write_text(json.dumps({"token_ids": alone["new_tokens"]}) + "\n")
    assert main([*generate, "--lookup-corpus", str(corpus), prompt]) == 0
    with_corpus = json.loads(capsys.readouterr().out)
    assert with_corpus["new_tokens"] == alone["new_tokens"]
    assert with_corpus["stats"]["mean_accepted_length"] > alone["stats"]["mean_accepted_length"]

    base = AutoModelForCausalLM.from_pretrained(models / "base").eval()
    ids = torch.tensor([[9, 14, 3, 27, 40, 11]])

    def run_row(**options):  # noqa: ANN202
        methods = build_methods(base, None, prompt_lookup=True, only=["none+lookup"], **options)
        return next(m for m in methods if m.name == "none+lookup").run([ids], 24)

    plain = run_row()
    answer = [ids[0].tolist() + plain.tokens[0]]
    held = run_row(lookup_corpus=answer)
    assert held.tokens == plain.tokens
    assert held.stats.mean_accepted_length > plain.stats.mean_accepted_length


def test_bench_skip_drafter_at_adds_a_skipping_sibling_to_each_draft_model_lookup_row(models, tmp_path) -> None:
    """``--skip-drafter-at N``: beside each draft-model lookup row, a ``+lookup-skip`` row whose draft model skips
    the steps where the lookup matched at least N tokens: exact, and on repeated lines the draft model runs fewer
    forwards for the same output (counted, not timed)."""
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(models / "base").eval()
    draft = AutoModelForCausalLM.from_pretrained(models / "draft").eval()
    methods = build_methods(
        base, draft, draft_ks=(2,), prompt_lookup=True, skip_drafter_at=2,
        only=["draft-k2+lookup", "draft-k2+lookup-skip", "draft-adaptive+lookup-skip"],
    )  # fmt: skip
    rows = {method.name: method for method in methods}
    assert list(rows) == ["hf-greedy", "draft-k2+lookup", "draft-k2+lookup-skip", "draft-adaptive+lookup-skip"]
    forwards: list[int] = []
    draft.register_forward_hook(lambda module, args, output: forwards.append(1))
    prompt = torch.tensor([[5, 9, 11, 7, 5, 9, 11, 7, 5, 9, 11, 7, 5, 9]])
    counted = {}
    for name in ("draft-k2+lookup", "draft-k2+lookup-skip"):
        forwards.clear()
        run = rows[name].run([prompt], 24)
        counted[name] = (run.tokens[0], len(forwards))
    (plain, plain_forwards), (skipping, skipping_forwards) = counted.values()
    assert skipping == plain
    assert skipping_forwards < plain_forwards, counted

    out = tmp_path / "bench"
    argv = ["bench", "--base", str(models / "base"), "--prompts", str(models / "prompts.jsonl"), "--out", str(out)]
    argv += ["--max-new-tokens", "16", "--draft-model", str(models / "draft"), "--draft-k", "2"]
    assert main([*argv, "--skip-drafter-at", "2", "--methods", "draft-k2+lookup-skip"]) == 0  # implies the lookup
    report = {row["name"]: row for row in json.loads((out / "report.json").read_text())["methods"]}
    assert list(report) == ["hf-greedy", "draft-k2+lookup-skip"]
    assert all(row["matches_greedy"] for row in report.values())
