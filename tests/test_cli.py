"""The command line on tiny models saved to disk: generate, bench and their errors."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
from helpers import tiny_model, tiny_tokenizer

from specheads.cli import main


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tokenizer = tiny_tokenizer()
    for name, kwargs in {"base": dict(seed=1), "draft": dict(seed=2, hidden=16, layers=1)}.items():
        model = tiny_model("llama", **kwargs)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    other = tiny_model("llama", seed=3, vocab_size=128)
    other.save_pretrained(root / "other-vocab")
    tiny_tokenizer(128).save_pretrained(root / "other-vocab")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"id": f"p{i}", "prompt": f"def f{i}(x):\n    return x"}) for i in range(3)) + "\n"
    )
    return root


def test_generate_prints_text_and_stats(model_dirs, capsys) -> None:
    code = main(
        [
            "generate",
            "--base",
            str(model_dirs / "base"),
            "--draft-model",
            str(model_dirs / "draft"),
            "--max-new-tokens",
            "12",
            "--stats",
            "def f(x):",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert "tau" in captured.err and "[draft]" in captured.err
    assert captured.out.strip()


@pytest.mark.parametrize("stats", [[], ["--stats"]])
def test_generate_shows_the_text_while_it_decodes(model_dirs, monkeypatch, stats) -> None:
    """The text is written as steps are accepted, not once at the end: a decode of minutes is never silent, with
    --stats too (the statistics follow on stderr)."""
    from specheads.inference.decoder import SpecDecoder

    events: list[tuple[str, str]] = []
    real_step = SpecDecoder._step

    def step(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        events.append(("step", ""))
        return real_step(self, *args, **kwargs)

    class Recorder(io.StringIO):
        def write(self, text: str) -> int:
            events.append(("out", text))
            return super().write(text)

    monkeypatch.setattr(SpecDecoder, "_step", step)
    monkeypatch.setattr("sys.stdout", Recorder())
    monkeypatch.setattr("sys.stderr", io.StringIO())
    base = str(model_dirs / "base")
    assert main(["generate", "--base", base, "--method", "none", "--max-new-tokens", "8", *stats, "def f(x):"]) == 0
    written = [i for i, (kind, text) in enumerate(events) if kind == "out" and text.strip()]
    steps = [i for i, (kind, _) in enumerate(events) if kind == "step"]
    assert len(steps) == 8 and written and written[0] < steps[-1]  # text out before the last step ran
    assert ("tau" in sys.stderr.getvalue()) is bool(stats)


def test_generate_json_matches_greedy_of_every_method(model_dirs, capsys) -> None:
    outputs = []
    for extra in ([], ["--draft-model", str(model_dirs / "draft")], ["--method", "prompt-lookup"]):
        assert (
            main(["generate", "--base", str(model_dirs / "base"), "--max-new-tokens", "10", "--json", *extra, "x = 1"])
            == 0
        )
        outputs.append(json.loads(capsys.readouterr().out)["new_tokens"])
    assert outputs[0] == outputs[1] == outputs[2]


def test_generate_rejects_a_draft_with_another_tokenizer(model_dirs, capsys) -> None:
    code = main(["generate", "--base", str(model_dirs / "base"), "--draft-model", str(model_dirs / "other-vocab"), "x"])
    assert code == 2
    assert "tokenizer differs" in capsys.readouterr().err


def test_bench_writes_the_report(model_dirs, tmp_path, capsys) -> None:
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--base",
            str(model_dirs / "base"),
            "--draft-model",
            str(model_dirs / "draft"),
            "--prompts",
            str(model_dirs / "prompts.jsonl"),
            "--max-new-tokens",
            "8",
            "--draft-k",
            "1,3",
            "--lookup-k",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    for span in ("load_before", "load_during"):  # how busy other processes kept the machine, recorded with the times
        assert set(report["machine"][span]) == {"cores", "busy", "source"}
    names = [row["name"] for row in report["methods"]]
    assert names == [
        "hf-greedy",
        "hf-assisted",
        "hf-prompt-lookup",
        "none",
        "draft-k1",
        "draft-k3",
        "draft-adaptive",
        "prompt-lookup",
    ]
    assert all(row["matches_greedy"] for row in report["methods"])
    assert report["prompts"] == 3 and report["max_new_tokens"] == 8
    for row in report["methods"]:
        assert set(row) >= {
            "name",
            "tokens_per_s",
            "speedup",
            "mean_accepted_length",
            "acceptance_rate_by_position",
            "matches_greedy",
            "wall_time_s",
        }
    assert report["methods"][0]["speedup"] == pytest.approx(1.0)
    assert (out / "report.md").read_text().count("| draft-k") == 2
    assert (out / "speedup.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("", "holds no prompts"),
        ('{"prompt": "a"}\nnot json\n', "prompts.jsonl:2"),
        ('{"id": 3}\n', "prompts.jsonl:1: no 'prompt'"),
        (b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n', "prompts.jsonl:2 is not UTF-8 text (byte 0xe9 at offset 15)"),
    ],
)
def test_bench_bad_prompt_files(model_dirs, tmp_path, capsys, content, message) -> None:
    prompts = tmp_path / "prompts.jsonl"
    if content is not None:
        prompts.write_bytes(content if isinstance(content, bytes) else content.encode())
    code = main(["bench", "--base", str(model_dirs / "base"), "--prompts", str(prompts), "--out", str(tmp_path)])
    assert code == 2
    assert message in capsys.readouterr().err


def test_bench_unknown_method(model_dirs, tmp_path, capsys) -> None:
    code = main(
        [
            "bench",
            "--base",
            str(model_dirs / "base"),
            "--prompts",
            str(model_dirs / "prompts.jsonl"),
            "--methods",
            "warp-drive",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 2
    assert "unknown bench methods" in capsys.readouterr().err


def test_unknown_method_is_refused_by_argparse(model_dirs) -> None:
    with pytest.raises(SystemExit):
        main(["generate", "--base", str(model_dirs / "base"), "--method", "telepathy", "x"])


def test_bench_with_medusa_heads_adds_medusa_rows(model_dirs, tmp_path) -> None:
    from helpers import tiny_model as build

    from specheads.heads import MedusaHeads

    heads_dir = tmp_path / "heads"
    MedusaHeads.from_base(build("llama", seed=1), num_heads=2).save_pretrained(heads_dir)
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--base",
            str(model_dirs / "base"),
            "--prompts",
            str(model_dirs / "prompts.jsonl"),
            "--max-new-tokens",
            "6",
            "--heads",
            str(heads_dir),
            "--trees",
            "medusa=chain-2,chain-3",
            "--methods",
            "none,medusa",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    names = [row["name"] for row in report["methods"]]
    assert names == ["hf-greedy", "none", "medusa-chain-2"]  # chain-3 is deeper than 2 heads: skipped
    assert all(row["matches_greedy"] for row in report["methods"])


def test_generate_with_medusa_heads(model_dirs, tmp_path, capsys) -> None:
    from helpers import tiny_model as build

    from specheads.heads import MedusaHeads

    MedusaHeads.from_base(build("llama", seed=1), num_heads=3).save_pretrained(tmp_path / "heads")
    outputs = []
    for extra in ([], ["--heads", str(tmp_path / "heads"), "--tree", "binary-7"]):
        assert (
            main(["generate", "--base", str(model_dirs / "base"), "--max-new-tokens", "10", "--json", *extra, "x = 1"])
            == 0
        )
        outputs.append(json.loads(capsys.readouterr().out)["new_tokens"])
    assert outputs[0] == outputs[1]


def _eagle_dir(tmp_path, version: int = 3):
    from helpers import tiny_model as build

    from specheads.heads import EagleHead

    heads_dir = tmp_path / f"eagle{version}"
    EagleHead.from_base(build("llama", seed=1), version=version).save_pretrained(heads_dir)
    return heads_dir


def test_generate_with_eagle_heads_infers_the_method_and_matches_greedy(model_dirs, tmp_path, capsys) -> None:
    heads_dir = _eagle_dir(tmp_path)
    runs = (
        [],
        ["--heads", str(heads_dir)],
        ["--heads", str(heads_dir), "--tree", "dynamic", "--tree-top-k", "2", "--depth", "3", "--total-tokens", "4"],
        ["--heads", str(heads_dir), "--tree", "binary-7"],
    )
    outputs = []
    for extra in runs:
        assert (
            main(["generate", "--base", str(model_dirs / "base"), "--max-new-tokens", "10", "--json", *extra, "x = 1"])
            == 0
        )
        outputs.append(json.loads(capsys.readouterr().out)["new_tokens"])
    assert all(output == outputs[0] for output in outputs)
    code = main(["generate", "--base", str(model_dirs / "base"), "--heads", str(heads_dir), "--stats", "x = 1"])
    assert code == 0 and "[eagle]" in capsys.readouterr().err


def test_dynamic_tree_keywords_need_eagle_heads_and_a_dynamic_tree(model_dirs, tmp_path, capsys) -> None:
    base = str(model_dirs / "base")
    assert main(["generate", "--base", base, "--tree", "dynamic", "x = 1"]) == 2
    assert "EAGLE" in capsys.readouterr().err
    assert main(["generate", "--base", base, "--heads", str(_eagle_dir(tmp_path)), "--depth", "0", "x"]) == 2
    assert "tree='dynamic'" in capsys.readouterr().err


def test_bench_with_eagle_heads_adds_eagle_rows_with_the_draft_verify_split(model_dirs, tmp_path) -> None:
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--base",
            str(model_dirs / "base"),
            "--prompts",
            str(model_dirs / "prompts.jsonl"),
            "--max-new-tokens",
            "6",
            "--heads",
            str(_eagle_dir(tmp_path, version=1)),
            "--trees",
            "eagle=chain-3,dynamic,auto",
            "--methods",
            "none,eagle",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    rows = {row["name"]: row for row in report["methods"]}
    assert list(rows) == ["hf-greedy", "none", "eagle-chain-3", "eagle-dynamic", "eagle-auto"]
    assert all(row["matches_greedy"] for row in rows.values())
    assert rows["eagle-dynamic"]["draft_ms_per_step"] > 0 and rows["eagle-dynamic"]["verify_ms_per_step"] > 0
    assert rows["hf-greedy"]["draft_ms_per_step"] is None
    assert "draft / verify ms per step" in (out / "report.md").read_text()


def test_bench_trees_option_is_checked(model_dirs, tmp_path, capsys) -> None:
    code = main(
        ["bench", "--base", str(model_dirs / "base"), "--prompts", str(model_dirs / "prompts.jsonl")]
        + ["--trees", "hydra=chain-2", "--out", str(tmp_path / "b")]
    )
    assert code == 2 and "TYPE=T1,T2" in capsys.readouterr().err


def test_bench_batch_sizes_report_each_size_against_batched_greedy(model_dirs, tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"  # prompts of different lengths, so that the batched baseline pads
    texts = ["x = 1", "def f(x):\n    return x + 1", "y", "for i in range(3):\n    print(i)"]
    prompts.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in texts))
    out = tmp_path / "bench"
    code = main(
        ["bench", "--base", str(model_dirs / "base"), "--draft-model", str(model_dirs / "draft")]
        + ["--prompts", str(prompts), "--max-new-tokens", "4", "--draft-k", "2", "--lookup-k", "3"]
        + ["--methods", "hf-assisted,none,draft-k2,prompt-lookup", "--batch-size", "2", "1", "--out", str(out)]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["batch_sizes"] == [1, 2]
    by_size = report["by_batch_size"]
    assert [row["name"] for row in by_size["1"]] == ["hf-greedy", "hf-assisted", "none", "draft-k2", "prompt-lookup"]
    assert [row["name"] for row in by_size["2"]] == ["hf-greedy", "none", "draft-k2", "prompt-lookup"]
    assert report["methods"] == by_size["1"]
    for row in by_size["1"] + by_size["2"]:
        assert row["matches_greedy"], row["name"]
        assert row["new_tokens"] == 4 * len(texts)
    assert all(row["matches_batched_greedy"] and row["matches_unbatched_greedy"] for row in by_size["2"])
    assert by_size["2"][0]["speedup"] == pytest.approx(1.0)
    assert any("hf-assisted" in note and "batch size 2" in note for note in report["notes"])
    markdown = (out / "report.md").read_text()
    assert "## speed-up by batch size" in markdown and "## batch size 2" in markdown
    summary = markdown.split("## batch size 1")[0]
    assert [line for line in summary.splitlines() if line.startswith("| hf-assisted |")][0].endswith("x | - |")
    assert (out / "speedup.png").stat().st_size > 1000


def test_bench_batch_size_must_fit_the_prompts(model_dirs, tmp_path, capsys) -> None:
    code = main(
        ["bench", "--base", str(model_dirs / "base"), "--prompts", str(model_dirs / "prompts.jsonl")]
        + ["--batch-size", "1", "4", "--out", str(tmp_path / "b")]
    )
    assert code == 2 and "--batch-size" in capsys.readouterr().err


def test_bench_batched_greedy_counts_each_row_up_to_its_own_eos() -> None:
    import torch

    from specheads.bench import build_methods, run_bench, summarize
    from specheads.prompts import Prompt

    tokenizer = tiny_tokenizer()
    base = tiny_model("llama", seed=1)
    prompts = [Prompt(str(i), text) for i, text in enumerate(["x = 1", "def g(y):\n    return y", "a", "b = [1]"])]
    first = torch.tensor([tokenizer(prompts[0].text)["input_ids"]])
    greedy = base.generate(first, attention_mask=torch.ones_like(first), do_sample=False, max_new_tokens=6)
    base.generation_config.eos_token_id = int(greedy[0, first.shape[1] + 2])  # prompt 0 stops after 3 tokens
    methods = build_methods(base, None, only=["none", "prompt-lookup"], lookup_k=3)
    run_bench(methods, prompts, tokenizer, 6, progress=False, batch_sizes=(1, 2, 4))
    for size in (1, 2, 4):
        rows = summarize(methods, size)
        assert [row["name"] for row in rows] == ["hf-greedy", "none", "prompt-lookup"]
        assert all(row["matches_greedy"] and row.get("matches_batched_greedy", True) for row in rows), size
        assert rows[0]["new_tokens"] == rows[1]["new_tokens"] < 6 * len(prompts)
    assert len(methods[0].runs[4].outputs[(0, 0)]) == 3


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--base", "default", "--threads", "0", "x"],
        ["generate", "--base", "default", "--threads", "-1", "x"],
        ["generate", "--base", "default", "--num-speculative-tokens", "0", "x"],
        ["generate", "--base", "default", "--heads", "default", "--draft-model", "default", "x"],
        ["bench", "--base", "default", "--limit", "0", "--out", "o"],
    ],
)
def test_counts_below_one_and_conflicting_drafters_are_usage_errors(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "expected an integer >= 1" in err or "not allowed with argument" in err


def test_bare_command_prints_the_help_and_version_works(capsys) -> None:
    assert main([]) == 2
    assert "usage: specheads" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("specheads ")


def test_missing_local_base_and_cuda_without_a_device_are_named(tmp_path, capsys) -> None:
    assert main(["generate", "--base", str(tmp_path / "nope"), "x"]) == 2
    assert f"the base model folder {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    if not __import__("torch").cuda.is_available():
        assert main(["generate", "--base", "default", "--device", "cuda", "x"]) == 2
        assert "no CUDA device is available here" in capsys.readouterr().err


# --out that cannot be written: (command, --out below tmp_path, the error after "--out PATH").
BAD_OUTS = {
    "bench-a-file": ("bench", "a-file", "is a file; give a directory"),
    "bench-below-a-file": ("bench", "a-file/report", "cannot be created: {tmp}/a-file is a file, not a directory"),
    "bench-read-only": ("bench", "read-only/report", "cannot be created: {tmp}/read-only is not writable"),
    "distill-a-folder": ("distill", "a-folder", "is a directory; give a file"),
    "distill-read-only": ("distill", "read-only/d.jsonl", "cannot be created: {tmp}/read-only is not writable"),
    "export-a-file": ("eagle3", "a-file", "is a file; give a directory"),
    "export-read-only-parent": ("eagle3", "read-only/empty", "cannot be created: {tmp}/read-only is not writable"),
    "export-gguf-a-folder": ("gguf", "a-folder.gguf", "is a directory; give a file"),
}


@pytest.mark.parametrize("case", list(BAD_OUTS))
def test_an_unwritable_out_is_one_line_naming_it_before_any_work(case, model_dirs, tmp_path, monkeypatch, capsys):
    command, name, message = BAD_OUTS[case]
    (tmp_path / "a-file").write_text("mine")
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-folder.gguf").mkdir()
    read_only = tmp_path / "read-only"
    (read_only / "empty").mkdir(parents=True)
    read_only.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: os.access answers for read-only as it would for anyone else
        access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != read_only and access(path, mode, **kw))

    def work(*args, **kwargs):
        raise AssertionError("a model or tokenizer loaded before --out was checked")

    monkeypatch.setattr("specheads.loading.load_tokenizer", work)
    monkeypatch.setattr("specheads.loading.load_causal_lm", work)
    out, base, prompts = tmp_path / name, str(model_dirs / "base"), str(model_dirs / "prompts.jsonl")
    argv = {
        "bench": ["bench", "--base", base, "--prompts", prompts, "--max-new-tokens", "1"],
        "distill": ["distill", "--base", base, "--prompts", prompts, "--max-new-tokens", "1"],
    }.get(command, ["export", "--heads", str(_eagle_dir(tmp_path)), "--base", base, "--format", command])
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    program = "export" if argv[0] == "export" else command
    assert err == f"specheads {program}: error: --out {out} {message.format(tmp=tmp_path)}\n"
    assert (tmp_path / "a-file").read_text() == "mine" and sorted(p.name for p in read_only.iterdir()) == ["empty"]


def test_a_prompt_that_is_not_utf8_is_named_not_a_traceback(model_dirs, monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"def caf\xe9():\n")))
    assert main(["generate", "--base", str(model_dirs / "base"), "--max-new-tokens", "2", "-"]) == 2
    assert "standard input is not UTF-8 text (byte 0xe9 at offset 7)" in capsys.readouterr().err
    # A command-line argument holding undecodable bytes reaches Python as lone surrogates (surrogateescape).
    assert main(["generate", "--base", str(model_dirs / "base"), "--max-new-tokens", "2", "def caf\udce9"]) == 2
    assert "the prompt is not valid Unicode text (character 7" in capsys.readouterr().err


def test_output_cut_by_the_position_limit_is_reported(model_dirs, capsys) -> None:
    base = str(model_dirs / "base")  # 256 positions
    assert main(["generate", "--base", base, "--max-new-tokens", "300", "--json", "def f(x):"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["finish_reason"] == "max_length"
    assert record["tokens_cut"] == 300 - len(record["new_tokens"]) > 0
    assert f"{record['tokens_cut']} of the tokens asked for did not fit" in captured.err
    assert main(["generate", "--base", base, "--max-new-tokens", "300", "def f(x):"]) == 0  # streamed
    assert "at the model's position limit (256 tokens with the prompt)" in capsys.readouterr().err
    assert main(["generate", "--base", base, "--max-new-tokens", "3", "def f(x):"]) == 0
    assert "position limit" not in capsys.readouterr().err


def test_a_request_beyond_the_model_positions_is_cut_or_refused_in_one_line(model_dirs, capsys) -> None:
    base = str(model_dirs / "base")  # 256 positions
    assert main(["generate", "--base", base, "--max-new-tokens", str(10**6), "--json", "def f(x):"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["finish_reason"] == "max_length" and len(record["new_tokens"]) == 256 - len("def f(x):")
    assert main(["generate", "--base", base, "--max-new-tokens", "2", "x" * 300]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the prompt has 300 tokens; the model allows at most 256 positions" in err


def test_acceptance_choices_are_the_rules_and_a_bad_one_is_a_usage_error(capsys) -> None:
    from specheads.cli import ACCEPTANCE_CHOICES
    from specheads.inference.acceptance import ACCEPTANCE_RULES

    assert ("auto", *ACCEPTANCE_RULES) == ACCEPTANCE_CHOICES
    with pytest.raises(SystemExit):
        main(["generate", "x", "--base", "default", "--acceptance", "magic"])
    assert "invalid choice: 'magic'" in capsys.readouterr().err


@pytest.mark.parametrize("checkout", [True, False])
def test_a_missing_optional_dependency_names_its_extra(monkeypatch, capsys, tmp_path, checkout) -> None:
    """A command whose extra is not installed names the extra and the pip command for this install: from a
    checkout, the extra of the checkout (``pip install "specheads[...]"`` would look for specheads on the index)."""
    import specheads.cli as cli
    from specheads import extras

    def needs_peft(args):  # noqa: ANN001, ANN202
        raise ModuleNotFoundError("No module named 'peft.tuners'", name="peft.tuners")

    monkeypatch.setattr(extras, "source_checkout", lambda: tmp_path if checkout else None)
    parser = cli.build_parser()
    args = parser.parse_args(["train", "--config", "x.yaml"])
    monkeypatch.setattr(cli, "build_parser", lambda: _Fixed(parser, args))
    args.handler = needs_peft
    assert cli.main(["train"]) == 2
    command = f'pip install -e "{tmp_path}[train]"' if checkout else 'pip install "specheads[train]"'
    expected = f"specheads train: error: peft is not installed; this command needs the train extra: {command}"
    assert capsys.readouterr().err == f"{expected}  (or: pip install peft)\n"


class _Fixed:
    def __init__(self, parser, args) -> None:  # noqa: ANN001
        self.parser, self.args = parser, args

    def parse_args(self, argv):  # noqa: ANN001, ANN201
        return self.args

    def print_help(self) -> None:
        self.parser.print_help()


# ------------------------------------------------------------------------------------------------------ --dtype
@pytest.mark.parametrize("command", ["generate", "bench", "calibrate", "distill", "demo", "train"])
def test_every_command_takes_dtype_and_refuses_a_bad_one(command, capsys) -> None:
    from specheads.cli import build_parser

    parser = build_parser()
    subcommand = parser._subparsers._group_actions[0].choices[command]
    assert "--dtype" in subcommand._option_string_actions
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--dtype", "float8", *(["x"] if command == "generate" else [])])
    assert exit_info.value.code == 2
    assert "invalid choice: 'float8'" in capsys.readouterr().err


def test_generate_in_bf16_equals_plain_bf16_decoding(model_dirs, capsys) -> None:
    outputs = []
    base = str(model_dirs / "base")
    for extra in ([], ["--draft-model", str(model_dirs / "draft")], ["--method", "prompt-lookup"]):
        code = main(
            ["generate", "--base", base, "--dtype", "bfloat16", "--max-new-tokens", "12", "--json", *extra, "x = 1"]
        )
        assert code == 0
        outputs.append(json.loads(capsys.readouterr().out)["new_tokens"])
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]


def test_bench_in_bf16_records_the_dtype_and_compares_with_the_engines_own_decoding(model_dirs, tmp_path) -> None:
    out = tmp_path / "bench"
    args = ["bench", "--base", str(model_dirs / "base"), "--draft-model", str(model_dirs / "draft"), "--dtype",
            "bfloat16", "--prompts", str(model_dirs / "prompts.jsonl"), "--max-new-tokens", "8", "--draft-k", "3",
            "--methods", "draft-k3,prompt-lookup", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["base"]["dtype"] == "torch.bfloat16" and report["draft"]["dtype"] == "torch.bfloat16"
    assert report["exact_reference"] == "none"
    rows = {row["name"]: row for row in report["methods"]}
    assert set(rows) == {"hf-greedy", "none", "draft-k3", "prompt-lookup"}  # none stays: it is the reference
    assert rows["draft-k3"]["matches_greedy"] and rows["prompt-lookup"]["matches_greedy"]
    assert "matches_hf_greedy" in rows["draft-k3"]
    assert "exactness: 'matches greedy' compares every row with none" in (out / "report.md").read_text()


def test_a_mistyped_named_base_is_one_line(capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["generate", "--base", "smolm2-135m", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "neither a local folder, a .gguf file nor a named base (did you mean 'smollm2-135m'?)" in err
    assert "the hub is offline" in err


def test_distill_with_nothing_listening_is_one_line_naming_the_url(model_dirs, tmp_path, capsys) -> None:
    code = main(["distill", "--base", str(model_dirs / "base"), "--prompts", str(model_dirs / "prompts.jsonl"),
                 "--server", "http://127.0.0.1:9", "--retries", "0", "--out", str(tmp_path / "d.jsonl")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "http://127.0.0.1:9/v1/models" in err[0] and "check --server" in err[0]
