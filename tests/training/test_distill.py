"""Self-distillation: the base's own greedy outputs, batched; resuming; sampling reproducibility; bad input; the same
files written faster by the speculative engine (EAGLE heads, a draft model)."""

from __future__ import annotations

import json
import logging
from unittest.mock import ANY

import pytest
import torch
from helpers import base_samples, tiny_model, tiny_tokenizer, train_eagle_head

from specheads import SpecDecoder
from specheads.cli import main
from specheads.prompts import load_prompts
from specheads.training.distill import distill

MAX_NEW = 12
PROMPTS = ["def f(x):\n    return x", "c", "import os\nprint(1)", "class A:\n    pass  # done", "x = 1", "xy"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    model = tiny_model("llama", seed=1)  # no EOS in its generation config: the tokenizer's EOS (1) stops it
    tokenizer = tiny_tokenizer()
    model.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return root, model, tokenizer


def run(root, out, *extra: str) -> int:
    args = ["--base", str(root / "base"), "--prompts", str(root / "prompts.jsonl"), "--out", str(out)]
    return main(["distill", *args, "--max-new-tokens", str(MAX_NEW), *extra])


def read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def contents(path) -> list[dict]:
    """The records without their provenance (which engine, dtype and seed wrote each)."""
    return [{key: value for key, value in record.items() if key != "provenance"} for record in read(path)]


def unbatched_greedy(model, token_ids: list[int]) -> list[int]:
    """transformers' greedy output for one prompt alone, cut before the first EOS."""
    prompt = torch.tensor([token_ids])
    out = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=1
    )[0, prompt.shape[1] :].tolist()
    return out[: out.index(1)] if 1 in out else out


def test_greedy_records_are_the_base_own_unbatched_outputs(setup, tmp_path) -> None:
    root, model, tokenizer = setup
    out = tmp_path / "distilled.jsonl"
    assert run(root, out, "--batch-size", "4") == 0  # batches of 4 and 2, prompts of different lengths
    records = read(out)
    assert [r["id"] for r in records] == [f"p{i}" for i in range(len(PROMPTS))]
    references = [unbatched_greedy(model, tokenizer(p)["input_ids"]) for p in PROMPTS]
    assert any(len(ref) < MAX_NEW for ref in references)  # the fixture exercises the cut at EOS
    for record, prompt, reference in zip(records, PROMPTS, references, strict=True):
        assert record["prompt"] == prompt
        assert record["response"] == tokenizer.decode(reference)
        assert record["text"] == prompt + record["response"]
        assert "conversations" not in record  # the tokenizer has no chat template


def test_resumed_sampled_run_equals_one_shot_run(setup, tmp_path) -> None:
    root, _, _ = setup
    sampled = ["--temperature", "1.0", "--top-k", "50", "--seed", "7"]
    one_shot, resumed = tmp_path / "one-shot.jsonl", tmp_path / "resumed.jsonl"
    assert run(root, one_shot, "--batch-size", "4", *sampled) == 0
    assert run(root, resumed, "--batch-size", "2", "--limit", "3", *sampled) == 0
    assert len(read(resumed)) == 3
    assert run(root, resumed, "--batch-size", "3", *sampled) == 0
    records = read(resumed)
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in read(one_shot))  # every id, once
    assert {r["id"]: r for r in records} == {r["id"]: r for r in read(one_shot)}
    greedy = tmp_path / "greedy.jsonl"
    assert run(root, greedy) == 0
    assert [r["response"] for r in read(greedy)] != [r["response"] for r in records]  # it did sample


def test_finished_file_loads_no_model(setup, tmp_path, capsys) -> None:
    root, _, _ = setup
    out = tmp_path / "distilled.jsonl"
    assert run(root, out) == 0
    capsys.readouterr()
    assert run(root, out) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_truncated_last_line_is_dropped_and_regenerated(setup, tmp_path, caplog) -> None:
    root, _, _ = setup
    out = tmp_path / "distilled.jsonl"
    assert run(root, out) == 0
    complete = out.read_bytes()
    out.write_bytes(complete[:-9])  # a crash mid-write of the last record
    with caplog.at_level(logging.WARNING):
        assert run(root, out) == 0
    assert "truncated last line" in caplog.text
    assert out.read_bytes() == complete


def test_library_call_with_chat_template_and_conversations(setup, tmp_path) -> None:
    _, model, tokenizer = setup
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    prompts_file = tmp_path / "prompts.jsonl"
    conversation = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}, {"from": "human", "value": "x"}]
    prompts_file.write_text(json.dumps({"prompt": "def f"}) + "\n" + json.dumps({"conversations": conversation}))
    prompts = load_prompts(prompts_file, tokenizer)
    out = tmp_path / "chat.jsonl"
    assert distill(model, tokenizer, prompts, out, max_new_tokens=MAX_NEW, batch_size=2, progress=False).written == 2
    plain, chat = read(out)
    assert plain["prompt"] == "user: def f\nassistant: "
    assert plain["conversations"] == [{"from": "human", "value": "def f"}, {"from": "gpt", "value": plain["response"]}]
    assert plain["response"] == tokenizer.decode(unbatched_greedy(model, tokenizer(plain["prompt"])["input_ids"]))
    assert chat["prompt"] == "user: hi\nassistant: yo\nuser: x\nassistant: "
    assert chat["conversations"] == [*conversation, {"from": "gpt", "value": chat["response"]}]
    assert all(r["text"] == r["prompt"] + r["response"] for r in (plain, chat))


def test_templated_prompts_carry_the_template_bos_only(setup, tmp_path, capsys) -> None:
    """Plain prompts wrapped by the template, ShareGPT conversations and multi-turn records (their first turn) are
    tokenised as the decoder and bench tokenise them: one BOS, the template's, and the generation prompt last."""
    from chat_helpers import GENERATION_PROMPT, chat_tokenizer

    from specheads.prompts import render_conversation

    _, model, _ = setup
    tokenizer = chat_tokenizer()
    conversation = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}, {"from": "human", "value": "x"}]
    records = [{"id": "plain", "prompt": "def f"}, {"id": "chat", "conversations": conversation}]
    records.append({"id": "turns", "category": "writing", "turns": ["a = 1", "b = 2"]})
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(record) + "\n" for record in records))
    prompts = load_prompts(prompts_file, tokenizer)
    out = tmp_path / "chat.jsonl"
    assert distill(model, tokenizer, prompts, out, max_new_tokens=MAX_NEW, batch_size=3, progress=False).written == 3
    first_messages = [
        [{"role": "user", "content": "def f"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "x"}],
        [{"role": "user", "content": "a = 1"}],
    ]
    for record, messages in zip(read(out), first_messages, strict=True):
        ids = render_conversation(tokenizer, messages)
        assert ids[0] == tokenizer.bos_token_id and tokenizer.bos_token_id not in ids[1:]
        assert record["prompt"] == tokenizer.decode(ids) and record["prompt"].endswith(GENERATION_PROMPT)
        assert record["response"] == tokenizer.decode(unbatched_greedy(model, ids))
    assert read(out)[2]["conversations"] == [{"from": "human", "value": "a = 1"}, {"from": "gpt", "value": ANY}]
    model.save_pretrained(tmp_path / "chat-base")
    tokenizer.save_pretrained(tmp_path / "chat-base")
    args = ["--base", str(tmp_path / "chat-base"), "--prompts", str(prompts_file), "--out", str(tmp_path / "cli.jsonl")]
    assert main(["distill", *args, "--max-new-tokens", str(MAX_NEW)]) == 0
    assert "1 of 3 prompts have more than one turn" in capsys.readouterr().err
    assert (tmp_path / "cli.jsonl").read_bytes() == out.read_bytes()


@pytest.fixture(scope="module")
def drafters(setup):
    """``--heads`` and ``--draft-model`` arguments: trained EAGLE-3 heads (partial acceptance) and a draft model with
    the base's weights (every draft accepted), saved next to the base."""
    root, model, _ = setup
    train_eagle_head(model, base_samples(model, rows=8, new_tokens=40), steps=60).save_pretrained(root / "eagle")
    tiny_model("llama", seed=1).save_pretrained(root / "draft")
    tiny_tokenizer().save_pretrained(root / "draft")
    return {"heads": ["--heads", str(root / "eagle")], "draft": ["--draft-model", str(root / "draft")]}


@pytest.mark.parametrize("drafter", ["heads", "draft"])
@pytest.mark.parametrize("batch_size", ["1", "4"])
def test_speculative_greedy_file_equals_plain_file(setup, drafters, tmp_path, capsys, drafter, batch_size) -> None:
    root, _, _ = setup
    plain, speculative = tmp_path / "plain.jsonl", tmp_path / "speculative.jsonl"
    assert run(root, plain, "--batch-size", batch_size) == 0
    assert "tau" not in capsys.readouterr().out
    assert run(root, speculative, "--batch-size", batch_size, *drafters[drafter]) == 0
    printed = capsys.readouterr().out
    assert "tokens/s, tau" in printed and float(printed.split("tau ")[1].split()[0]) > 1.0  # drafts were accepted
    assert contents(speculative) == contents(plain)
    assert read(plain)[0]["provenance"] == {"engine": "transformers.generate", "dtype": "float32", "device": "cpu",
                                            "temperature": 0.0, "seed": 0}  # fmt: skip
    assert read(speculative)[0]["provenance"]["engine"].startswith("specheads (")


def test_speculative_resume_and_tree(setup, drafters, tmp_path) -> None:
    root, _, _ = setup
    plain, resumed = tmp_path / "plain.jsonl", tmp_path / "resumed.jsonl"
    assert run(root, plain, "--batch-size", "4") == 0
    assert run(root, resumed, "--batch-size", "2", "--limit", "3", *drafters["heads"], "--tree", "chain-2") == 0
    assert run(root, resumed, "--batch-size", "3", *drafters["draft"], "--num-speculative-tokens", "3") == 0
    assert contents(resumed) == contents(plain)


@pytest.mark.parametrize("drafter", ["heads", "draft"])
def test_speculative_sampling_is_reproducible_across_batches_and_resuming(setup, drafters, tmp_path, drafter) -> None:
    root, _, _ = setup
    sampled = ["--temperature", "1.0", "--top-k", "50", "--seed", "7", *drafters[drafter]]
    one_shot, resumed = tmp_path / "one-shot.jsonl", tmp_path / "resumed.jsonl"
    assert run(root, one_shot, "--batch-size", "4", *sampled) == 0
    assert run(root, resumed, "--batch-size", "1", "--limit", "3", *sampled) == 0
    assert run(root, resumed, "--batch-size", "3", *sampled) == 0
    assert {r["id"]: r for r in read(resumed)} == {r["id"]: r for r in read(one_shot)}


def test_library_call_with_a_decoder(setup, tmp_path) -> None:
    _, model, tokenizer = setup
    prompts = load_prompts(setup[0] / "prompts.jsonl", tokenizer)
    plain, speculative = tmp_path / "plain.jsonl", tmp_path / "speculative.jsonl"
    settings = dict(max_new_tokens=MAX_NEW, batch_size=3, progress=False)
    result = distill(model, tokenizer, prompts, plain, **settings)
    assert result.spec_stats is None and result.mean_accepted_length is None and result.new_tokens > 0
    decoder = SpecDecoder.from_pretrained(model, draft_model=tiny_model("llama", seed=1), tokenizer=tokenizer)
    result = distill(
        model, tokenizer, prompts, speculative, decoder=decoder, decoder_options={"tree": "chain-4"}, **settings
    )
    assert result.written == len(PROMPTS) and result.mean_accepted_length > 1.0
    assert contents(speculative) == contents(plain)
    with pytest.raises(ValueError, match="wraps another model"):
        distill(tiny_model("llama", seed=1), tokenizer, prompts, tmp_path / "x.jsonl", decoder=decoder, **settings)
    with pytest.raises(ValueError, match="may not set"):
        distill(model, tokenizer, prompts, tmp_path / "x.jsonl", decoder=decoder, decoder_options={"seed": 1})
    with pytest.raises(ValueError, match="need a decoder"):
        distill(model, tokenizer, prompts, tmp_path / "x.jsonl", decoder_options={"tree": "chain-2"})


def test_heads_and_draft_model_together_are_refused(setup, drafters, tmp_path, capsys) -> None:
    root, _, _ = setup
    with pytest.raises(SystemExit) as error:
        run(root, tmp_path / "out.jsonl", *drafters["heads"], *drafters["draft"])
    assert error.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_medusa2_heads_are_refused(setup, tmp_path, capsys) -> None:
    """Medusa-2 heads decode the base with their LoRA adapter merged: the data would not be the base's own."""
    from specheads.heads import MedusaHeads

    root, model, _ = setup
    MedusaHeads.from_base(model, num_heads=2).save_pretrained(tmp_path / "heads")
    (tmp_path / "heads" / "adapter").mkdir()
    assert run(root, tmp_path / "out.jsonl", "--heads", str(tmp_path / "heads")) == 2
    assert "Medusa-2 heads" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "prompts", "message"),
    [
        (["--max-new-tokens", "0"], None, "argument --max-new-tokens: expected an integer >= 1, got 0"),
        (["--batch-size", "0"], None, "argument --batch-size: expected an integer >= 1, got 0"),
        (["--temperature", "-1"], None, "temperature must be >= 0"),
        ([], "missing", "does not exist"),
        ([], "", "holds no prompts"),
        ([], '{"prompt": "a"}\nnot json\n', "prompts.jsonl:2"),
        ([], '{"id": "q", "prompt": "a"}\n{"id": "q", "prompt": "b"}\n', "'q' appears more than once"),
        (["--tree", "chain-2"], None, "--tree and --num-speculative-tokens need --heads or --draft-model"),
    ],
)
def test_bad_input_exits_2(setup, tmp_path, capsys, extra, prompts, message) -> None:
    root, _, _ = setup
    args = ["distill", "--base", str(root / "base"), "--out", str(tmp_path / "out.jsonl")]
    prompts_file = root / "prompts.jsonl"
    if prompts is not None:
        prompts_file = tmp_path / "prompts.jsonl"
        if prompts != "missing":
            prompts_file.write_text(prompts)
    try:
        code = main([*args, "--prompts", str(prompts_file), *extra])
    except SystemExit as usage_error:  # argparse rejects a count below 1 itself
        code = usage_error.code
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"id": "p0"}\nnot json\n{"id": "p1"}\n', "out.jsonl:2: not valid JSON"),
        ('{"id": "p0"}\n{"id": "p0"}\n', "out.jsonl:2: id 'p0' appears twice"),
        ('{"prompt": "a"}\n', "out.jsonl:1: not a distill record"),
    ],
)
def test_corrupt_output_file_exits_2(setup, tmp_path, capsys, content, message) -> None:
    root, _, _ = setup
    out = tmp_path / "out.jsonl"
    out.write_text(content)
    assert run(root, out) == 2
    assert message in capsys.readouterr().err
    assert out.read_text() == content  # never rewritten


@pytest.mark.slow
def test_a_sigkilled_run_resumed_writes_the_uninterrupted_file(setup, tmp_path) -> None:
    """A real kill (SIGKILL of the process mid-run, no handler runs), then the same command again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root, _, _ = setup
    one_shot, killed = tmp_path / "one-shot.jsonl", tmp_path / "killed.jsonl"
    assert run(root, one_shot, "--batch-size", "1") == 0
    args = ["--base", str(root / "base"), "--prompts", str(root / "prompts.jsonl"), "--out", str(killed)]
    args += ["--max-new-tokens", str(MAX_NEW), "--batch-size", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    code = (  # each batch takes 0.3 s more, so that the kill lands between records of a running job
        "import sys, time\n"
        "from specheads.training import distill\n"
        "generate = distill._generate_batch\n"
        "distill._generate_batch = lambda *a, **k: (time.sleep(0.3), generate(*a, **k))[1]\n"
        "from specheads.cli import main\n"
        "sys.exit(main(['distill', *sys.argv[1:]]))\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if killed.is_file() and killed.read_text().count("\n") >= 2:
                break
            time.sleep(0.05)
        assert process.poll() is None, "distill finished before it could be killed"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    written = killed.read_text().count("\n")
    assert 2 <= written < len(PROMPTS)
    assert run(root, killed, "--batch-size", "2") == 0
    assert killed.read_bytes() == one_shot.read_bytes()


def test_prompts_that_copy_an_evaluation_set_are_skipped_and_counted(setup, tmp_path, capsys):
    root, _, _ = setup
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"prompt": PROMPTS[2]}) + "\n" + json.dumps({"prompt": PROMPTS[4]}) + "\n")
    out = tmp_path / "screened.jsonl"
    assert run(root, out, "--exclude-prompts", str(bench)) == 0
    assert [record["id"] for record in read(out)] == ["p0", "p1", "p3", "p5"]
    assert f"2 prompts skipped: they copy evaluation prompts ({bench} x2)" in capsys.readouterr().err
    everything = tmp_path / "all.jsonl"
    assert run(root, everything, "--exclude-prompts", str(bench), "--allow-evaluation-prompts") == 0
    assert len(read(everything)) == len(PROMPTS)


def test_a_prompt_whose_later_turn_copies_an_evaluation_prompt_is_skipped_and_counted(tmp_path, capsys) -> None:
    """A "turns" record is screened turn by turn: a copy in its second turn (asked with --all-turns) skips it. Here
    every prompt copies, so the command stops before loading any model (the folder holds only a tokenizer)."""
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(tmp_path / "tokenizer-only")
    leaked = "Explain in four short sentences why the night sky over a quiet desert looks darker than over a city."
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"turns": ["What is 2 + 2?", leaked]}) + "\n")
    records = [{"id": "first", "turns": ["Say: " + leaked]}, {"id": "later", "turns": ["def f", "x " + leaked]}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(record) + "\n" for record in records))
    args = ["distill", "--base", str(tmp_path / "tokenizer-only"), "--prompts", str(prompts), "--all-turns"]
    assert main([*args, "--out", str(tmp_path / "out.jsonl"), "--exclude-prompts", str(bench)]) == 2
    err = capsys.readouterr().err
    assert f"2 prompts skipped: they copy evaluation prompts ({bench} x2)" in err and "every prompt copies" in err
    assert not (tmp_path / "out.jsonl").exists()


def test_the_library_call_skips_evaluation_prompts_unless_allowed(setup, tmp_path, caplog) -> None:
    """distill() screens by itself, so a Python caller is kept from evaluation prompts as the command is: a copy is
    skipped with a warning that counts it, allow_evaluation_prompts keeps it, and prompts that all copy one are
    refused before anything is written."""
    root, model, tokenizer = setup
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"turns": ["What is 2 + 2?", PROMPTS[2]]}) + "\n")
    prompts = load_prompts(root / "prompts.jsonl", tokenizer)
    settings = {"max_new_tokens": MAX_NEW, "batch_size": 3, "progress": False, "exclude_prompts": [bench]}
    with caplog.at_level(logging.WARNING, logger="specheads.training.distill"):
        result = distill(model, tokenizer, prompts, tmp_path / "screened.jsonl", **settings)
    assert [record["id"] for record in read(tmp_path / "screened.jsonl")] == ["p0", "p1", "p3", "p4", "p5"]
    assert result.written == 5 and f"1 prompts skipped: they copy evaluation prompts ({bench} x1)" in caplog.text
    kept = distill(model, tokenizer, prompts, tmp_path / "all.jsonl", allow_evaluation_prompts=True, **settings)
    assert kept.written == len(PROMPTS)
    with pytest.raises(ValueError, match="^every prompt copies an evaluation set"):
        distill(model, tokenizer, prompts[2:3], tmp_path / "none.jsonl", **settings)
    assert not (tmp_path / "none.jsonl").exists()


def test_all_turns_asks_each_turn_after_the_base_own_answers(setup, tmp_path) -> None:
    """--all-turns: a "turns" record's turn k is the base's greedy answer to the conversation of its turns 1..k with
    its own earlier answers, rows of one batch at different turns; one record per conversation."""
    _, model, _ = setup
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    chats = {"two": ["def f", "and g"], "one": ["x = 1"], "three": ["a", "b b", "class C"]}
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"id": key, "turns": turns}) + "\n" for key, turns in chats.items()))
    prompts = load_prompts(prompts_file, tokenizer)
    out = tmp_path / "all.jsonl"
    result = distill(model, tokenizer, prompts, out, max_new_tokens=MAX_NEW, batch_size=3, progress=False,
                     all_turns=True)  # fmt: skip
    records = {record["id"]: record for record in read(out)}
    assert list(records) == list(chats) and result.written == 3
    generated = 0
    for key, turns in chats.items():
        messages, answers = [], []
        for turn in turns:  # the chained reference, one conversation alone
            messages.append({"role": "user", "content": turn})
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            tokens = unbatched_greedy(model, tokenizer(text, add_special_tokens=False)["input_ids"])
            answers.append(tokenizer.decode(tokens))
            messages.append({"role": "assistant", "content": answers[-1]})
            generated += len(tokens)
        record = records[key]
        assert record.get("responses", answers) == answers and record["response"] == answers[-1]
        assert ("responses" in record) == (len(turns) > 1)
        assert record["prompt"] == text and record["text"] == text + answers[-1]
        roles = {"user": "human", "assistant": "gpt"}
        assert record["conversations"] == [{"from": roles[m["role"]], "value": m["content"]} for m in messages]
    assert result.new_tokens == generated
    everything = [answer for r in records.values() for answer in r.get("responses", [r["response"]])]
    assert len(set(everything)) > 1  # the model's answers depend on the conversation: the comparison can fail
    # Without --all-turns the same prompts give their first turns only: the first answers of the chained file.
    first = tmp_path / "first.jsonl"
    distill(model, tokenizer, prompts, first, max_new_tokens=MAX_NEW, batch_size=2, progress=False)
    assert [r["response"] for r in read(first)] == [r.get("responses", [r["response"]])[0] for r in records.values()]
    assert not any("responses" in r for r in read(first))


def test_the_cli_answers_every_turn_with_all_turns(setup, tmp_path, capsys) -> None:
    _, model, _ = setup
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"id": "t", "turns": ["def f", "and g"]}) + "\n")
    args = ["distill", "--base", str(tmp_path / "base"), "--prompts", str(tmp_path / "prompts.jsonl")]
    args += ["--max-new-tokens", "4"]
    assert main([*args, "--out", str(tmp_path / "first.jsonl")]) == 0
    assert "1 of 1 prompts have more than one turn" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "all.jsonl"), "--all-turns"]) == 0
    assert "more than one turn" not in capsys.readouterr().err
    (first,), (chained,) = read(tmp_path / "first.jsonl"), read(tmp_path / "all.jsonl")
    assert len(chained["responses"]) == 2 and chained["responses"][0] == first["response"]
    assert chained["prompt"] == f"user: def f\nassistant: {first['response']}\nuser: and g\nassistant: "
