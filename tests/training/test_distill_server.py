"""distill --server against an OpenAI-compatible server on loopback (a small fake here; llama-server in
scripts/check_llamacpp.py): records in input order with the local engine's fields, the served model checked, bounded
concurrency, transient failures retried, a hard failure stopping with the records before it written, and resuming
without a duplicate or a gap."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from chat_helpers import CHATML
from helpers import tiny_tokenizer

from specheads.cli import main
from specheads.prompts import load_prompts

pytestmark = pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="needs pip install openai")
from specheads.training.distill import _encode, _model_input  # noqa: E402
from specheads.training.distill_server import ServerError, distill_server, with_retries  # noqa: E402

PROMPTS = [f"question {i}: " + "word " * (i % 5) for i in range(12)]


def _answer(ids: list[int]) -> str:
    """The fake model's deterministic response to a token-id prompt."""
    return f"answer-{sum(ids) % 997}-{len(ids)}"


class FakeServer:
    """``/v1/models`` and ``/v1/completions`` with scripted failures, on 127.0.0.1 and a free port.

    ``failures``: a list of actions consumed one per completion request: ``"500"`` (an HTTP 500), ``"drop"`` (the
    connection closed without an answer), ``"400"`` (a bad request) or ``None`` (answer normally). ``gather``: the
    first requests wait (5 s at most) until this many are in flight at once, so that a client's concurrency shows
    whatever the machine's load.
    """

    def __init__(
        self, vocab: int | None, models: tuple[str, ...] = ("tiny",), latency: float = 0.0, gather: int = 0
    ) -> None:
        self.vocab, self.models, self.latency, self.gather = vocab, models, latency, gather
        self.failures: list[str | None] = []
        self.requests: list[list[int]] = []
        self.in_flight = self.max_in_flight = 0
        self.prompt_token_offset = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                meta = {"n_vocab": server.vocab} if server.vocab is not None else None
                data = [
                    {"id": m, "object": "model", "created": 0, "owned_by": "me", "meta": meta} for m in server.models
                ]
                self._send(200, {"object": "list", "data": data})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    action = server.failures.pop(0) if server.failures else None
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                deadline = time.monotonic() + 5.0
                while server.max_in_flight < server.gather and time.monotonic() < deadline:
                    time.sleep(0.005)
                try:
                    time.sleep(server.latency)
                    if action == "drop":
                        self.close_connection = True
                        self.connection.close()
                        return
                    if action in ("500", "400"):
                        self._send(int(action), {"error": {"message": f"scripted {action}"}})
                        return
                    ids = body["prompt"]
                    with server.lock:
                        server.requests.append(ids)
                    text = _answer(ids)
                    usage = {"prompt_tokens": len(ids) + server.prompt_token_offset, "completion_tokens": 3,
                             "total_tokens": len(ids) + 3}  # fmt: skip
                    choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
                    self._send(200, {"id": "c", "object": "text_completion", "created": 0, "model": body["model"],
                                     "choices": [choice], "usage": usage})  # fmt: skip
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def tokenizer():
    tok = tiny_tokenizer()
    tok.chat_template = CHATML
    return tok


@pytest.fixture
def prompts(tokenizer, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return path, load_prompts(path, tokenizer)


def _expected(tokenizer, prompts) -> list[dict]:
    records = []
    for prompt in prompts:
        model_input = _model_input(prompt, tokenizer, True)
        response = _answer(_encode(tokenizer, model_input, prompt.id))
        records.append({"id": prompt.id, "prompt": model_input.text, "response": response,
                        "text": model_input.text + response, "conversations": [*model_input.turns,
                        {"from": "gpt", "value": response}]})  # fmt: skip
    return records


def _read(path) -> list[dict]:
    """The records without their provenance, which every one carries (checked here)."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        assert record.pop("provenance")["engine"].startswith("server http")
    return records


def _no_sleep(monkeypatch) -> None:
    import specheads.training.distill_server as module

    monkeypatch.setattr(module.time, "sleep", lambda s: None)


def test_records_in_input_order_with_the_local_fields(tokenizer, prompts, tmp_path) -> None:
    _, items = prompts
    with FakeServer(vocab=len(tokenizer), gather=4) as server:
        result = distill_server(server.url, tokenizer, items, tmp_path / "out.jsonl", max_new_tokens=8, concurrency=4,
                                progress=False)  # fmt: skip
        assert server.max_in_flight == 4  # bounded, and used
        assert result.written == len(PROMPTS) and result.new_tokens == 3 * len(PROMPTS)
        assert _read(tmp_path / "out.jsonl") == _expected(tokenizer, items)
        again = distill_server(server.url, tokenizer, items, tmp_path / "out.jsonl", progress=False)
        assert again.written == 0 and len(server.requests) == len(PROMPTS)  # resumed: nothing asked twice


def test_transient_failures_are_retried(tokenizer, prompts, tmp_path, monkeypatch) -> None:
    _no_sleep(monkeypatch)
    _, items = prompts
    with FakeServer(vocab=None) as server:
        server.failures = ["500", "500", "drop", None, "500"]
        distill_server(server.url, tokenizer, items, tmp_path / "out.jsonl", concurrency=2, retries=3, progress=False)
        assert _read(tmp_path / "out.jsonl") == _expected(tokenizer, items)


def test_a_hard_failure_stops_after_the_records_before_it_and_a_rerun_completes(tokenizer, prompts, tmp_path,
                                                                                 monkeypatch) -> None:  # fmt: skip
    _no_sleep(monkeypatch)
    _, items = prompts
    out = tmp_path / "out.jsonl"
    with FakeServer(vocab=None) as server:
        server.failures = [None, None, None, "500", "500", "500"]  # the 4th request fails past its 2 retries
        with pytest.raises(ServerError, match="prompt 'p3'.*500"):
            distill_server(server.url, tokenizer, items, out, concurrency=1, retries=2, progress=False)
        assert [r["id"] for r in _read(out)] == ["p0", "p1", "p2"]
        server.failures = [None, "400"]
        with pytest.raises(ServerError, match="prompt 'p4'.*400"):  # not transient: no retry
            distill_server(server.url, tokenizer, items, out, concurrency=1, retries=5, progress=False)
        distill_server(server.url, tokenizer, items, out, concurrency=3, progress=False)
    assert _read(out) == _expected(tokenizer, items)  # no duplicate, no gap, input order


def test_the_served_model_is_checked_against_our_tokenizer(tokenizer, prompts, tmp_path) -> None:
    _, items = prompts
    with FakeServer(vocab=len(tokenizer) + 1) as server, pytest.raises(ServerError, match="vocabulary of"):
        distill_server(server.url, tokenizer, items, tmp_path / "a.jsonl", progress=False)
    with FakeServer(vocab=None, models=("a", "b")) as server:
        with pytest.raises(ServerError, match="name one with --server-model"):
            distill_server(server.url, tokenizer, items, tmp_path / "a.jsonl", progress=False)
        with pytest.raises(ServerError, match="not 'c'"):
            distill_server(server.url, tokenizer, items, tmp_path / "a.jsonl", model="c", progress=False)
        distill_server(server.url, tokenizer, items[:2], tmp_path / "b.jsonl", model="b", progress=False)
        assert len(_read(tmp_path / "b.jsonl")) == 2
    with FakeServer(vocab=None) as server:
        server.prompt_token_offset = 1  # a server that adds a BOS (or tokenises the ids as text) is refused
        with pytest.raises(ServerError, match="counted .* prompt tokens"):
            distill_server(server.url, tokenizer, items, tmp_path / "c.jsonl", concurrency=1, progress=False)
    assert not (tmp_path / "a.jsonl").exists() or not (tmp_path / "a.jsonl").read_text()


def test_retry_backoff_doubles_and_gives_up() -> None:
    import openai

    try:  # openai 3 builds its errors on httpx2's requests, earlier releases on httpx's
        import httpx2 as http
    except ImportError:
        import httpx as http
    request = http.Request("POST", "http://127.0.0.1/v1/completions")
    slept, calls = [], []

    def flaky():
        calls.append(1)
        raise openai.APIConnectionError(request=request)

    with pytest.raises(ServerError, match="APIConnectionError"):
        with_retries(flaky, 3, "probe", sleep=slept.append)
    assert len(calls) == 4 and len(slept) == 3
    assert all(0.25 * 2**i <= s <= 0.75 * 2**i for i, s in enumerate(slept))


def test_the_cli(tokenizer, prompts, tmp_path, capsys) -> None:
    path, items = prompts
    tokenizer.save_pretrained(tmp_path / "tok")
    with FakeServer(vocab=len(tokenizer)) as server:
        args = ["distill", "--base", str(tmp_path / "tok"), "--prompts", str(path), "--out", str(tmp_path / "o.jsonl"),
                "--server", server.url + "/v1", "--concurrency", "3"]  # fmt: skip
        assert main(args) == 0
        assert "(3 in flight)" in capsys.readouterr().out
    assert _read(tmp_path / "o.jsonl") == _expected(tokenizer, items)
    assert (
        main(
            [
                "distill",
                "--base",
                str(tmp_path / "tok"),
                "--prompts",
                str(path),
                "--out",
                "x.jsonl",
                "--server",
                "http://127.0.0.1:1",
                "--heads",
                "default",
            ]
        )
        == 2
    )  # usage error; fmt: skip


def test_all_turns_are_requests_after_the_server_own_answers(tokenizer, tmp_path) -> None:
    path = tmp_path / "prompts.jsonl"
    chats = [["first question", "then this"], ["alone"], ["a", "b", "c"]]
    path.write_text("".join(json.dumps({"id": f"c{i}", "turns": turns}) + "\n" for i, turns in enumerate(chats)))
    items = load_prompts(path, tokenizer)
    with FakeServer(vocab=None) as server:
        result = distill_server(server.url, tokenizer, items, tmp_path / "out.jsonl", concurrency=3, progress=False,
                                all_turns=True)  # fmt: skip
        assert len(server.requests) == 6 and result.written == 3 and result.new_tokens == 3 * 6
    records = _read(tmp_path / "out.jsonl")
    for prompt, record in zip(items, records, strict=True):
        answers = []
        for _ in range(prompt.num_turns):  # each request carries the server's earlier answers
            model_input = _model_input(prompt, tokenizer, True, answers)
            answers.append(_answer(_encode(tokenizer, model_input, prompt.id)))
        assert record.get("responses", answers) == answers and record["response"] == answers[-1]
        assert record["prompt"] == model_input.text and record["text"] == model_input.text + answers[-1]
        assert [turn["value"] for turn in record["conversations"][1::2]] == answers
