"""Conversations through SpecDecoder.generate / stream and specheads generate: the chat template applied once (one
BOS, the generation prompt last), batches of conversations, and each kind of bad conversation named."""

from __future__ import annotations

import json

import pytest
import torch
from chat_helpers import GENERATION_PROMPT, chat_tokenizer
from helpers import greedy_reference, tiny_model

from specheads import SpecDecoder
from specheads.cli import main
from specheads.inference.drafters import DraftModelDrafter
from specheads.prompts import render_conversation

MAX_NEW = 10
CONVERSATION = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f(x):"}]
OTHER = [{"role": "user", "content": "x = 1"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "y"}]


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=1)


@pytest.fixture(scope="module")
def decoder(base) -> SpecDecoder:
    return SpecDecoder(base, DraftModelDrafter(tiny_model("llama", seed=2, hidden=16, layers=1), 3), chat_tokenizer())


def assert_rendered_once(tokenizer, sequence: torch.Tensor, prompt_length: int) -> None:
    prompt = sequence[0, :prompt_length].tolist()
    assert prompt[0] == tokenizer.bos_token_id and tokenizer.bos_token_id not in prompt[1:]
    assert tokenizer.decode(prompt).endswith(GENERATION_PROMPT)


def test_a_conversation_decodes_its_rendering_as_greedy_does(decoder, base) -> None:
    ids = render_conversation(decoder.tokenizer, CONVERSATION)
    out = decoder.generate(CONVERSATION, max_new_tokens=MAX_NEW)
    assert_rendered_once(decoder.tokenizer, out.sequences, len(ids))
    assert out.sequences.tolist() == greedy_reference(base, torch.tensor([ids]), MAX_NEW).tolist()
    streamed = decoder.stream(CONVERSATION, max_new_tokens=MAX_NEW)
    pieces = []
    while True:
        try:
            pieces.append(next(streamed))
        except StopIteration as stop:
            assert stop.value.new_tokens == out.new_tokens
            break
    assert "".join(pieces) == out.text


def test_a_raw_string_stays_raw(decoder) -> None:
    out = decoder.generate("def f(x):", max_new_tokens=2)
    assert out.sequences[0, : len("def f(x):") + 1].tolist() == decoder.tokenizer("def f(x):")["input_ids"]
    assert GENERATION_PROMPT not in decoder.tokenizer.decode(out.sequences[0])


def test_a_batch_of_conversations_equals_each_alone(decoder) -> None:
    batch = decoder.generate([CONVERSATION, OTHER], max_new_tokens=MAX_NEW)
    for conversation, row in zip([CONVERSATION, OTHER], batch, strict=True):
        alone = decoder.generate(conversation, max_new_tokens=MAX_NEW)
        assert row.new_tokens == alone.new_tokens
        assert_rendered_once(decoder.tokenizer, row.sequences, row.sequences.shape[1] - len(row.new_tokens))


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], "message 1: role 'robot'"),
        ([{"role": "user"}], "message 0: 'content' must be a string"),
        ([CONVERSATION, [{"role": "bot", "content": "x"}]], "prompt 1: message 0: role 'bot' is not one of"),
        ([CONVERSATION, []], "prompt 1: the conversation is empty"),
        ([CONVERSATION, "a string"], "mix types"),
        ([], "list of prompts is empty"),
    ],
)
def test_bad_conversations_are_named(decoder, prompt, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decoder.generate(prompt, max_new_tokens=2)


def test_a_conversation_needs_a_chat_template(base) -> None:
    with pytest.raises(ValueError, match="no chat template.*chat_template.*rendered as a string"):
        SpecDecoder(base, tokenizer=chat_tokenizer(chat_template=None)).generate(CONVERSATION, max_new_tokens=2)
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        SpecDecoder(base).generate(CONVERSATION, max_new_tokens=2)


@pytest.fixture(scope="module")
def base_dir(base, tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    base.save_pretrained(root / "base")
    chat_tokenizer().save_pretrained(root / "base")
    base.save_pretrained(root / "plain")
    chat_tokenizer(chat_template=None).save_pretrained(root / "plain")
    return root


def generate_json(capsys, *argv: str) -> dict:
    assert main(["generate", "--max-new-tokens", str(MAX_NEW), "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_chat_and_messages(decoder, base_dir, tmp_path, capsys) -> None:
    base = str(base_dir / "base")
    chat = generate_json(capsys, "--base", base, "--chat", "def f(x):")
    expected = decoder.generate([{"role": "user", "content": "def f(x):"}], max_new_tokens=MAX_NEW).new_tokens
    assert chat["new_tokens"] == expected
    raw = generate_json(capsys, "--base", base, "def f(x):")
    assert raw["new_tokens"] == decoder.generate("def f(x):", max_new_tokens=MAX_NEW).new_tokens
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps(OTHER[:2]))
    followed = generate_json(capsys, "--base", base, "--messages", str(messages), "y")  # PROMPT: the last user turn
    assert followed["new_tokens"] == decoder.generate(OTHER, max_new_tokens=MAX_NEW).new_tokens
    messages.write_text(json.dumps({"messages": OTHER}))
    assert generate_json(capsys, "--base", base, "--messages", str(messages))["new_tokens"] == followed["new_tokens"]


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ('[{"role": "bot", "content": "x"}]', [], "messages.json: message 0: role 'bot' is not one of"),
        ("[{", [], "messages.json: not valid JSON"),
        ("[]", [], "the conversation is empty"),
        (None, ["--chat", "x"], "no chat template"),
        (None, [], "give a PROMPT"),
    ],
)
def test_generate_bad_conversations_exit_2(base_dir, tmp_path, capsys, content, extra, message: str) -> None:
    argv = ["generate", "--base", str(base_dir / ("plain" if "--chat" in extra else "base")), *extra]
    if content is not None:
        (tmp_path / "messages.json").write_text(content)
        argv += ["--messages", str(tmp_path / "messages.json")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_generate_help_names_the_conversation_options(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = capsys.readouterr().out
    assert "--chat" in help_text and "--messages" in help_text and "chat template" in help_text
