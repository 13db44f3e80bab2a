"""Self-distillation through a serving engine: any OpenAI-compatible completions server (llama-server, vLLM, SGLang).

:func:`distill_server` writes the same records as :func:`specheads.training.distill.distill` (same prompt rendering,
same fields, same resume rules), but the responses come from ``POST {url}/v1/completions``:

- Prompts go as **token ids**, encoded here exactly as the local engine encodes them (the chat template rendered by
  the tokenizer we train with, no second BOS), so the server generates from the very prompt the heads are trained
  on. Servers that take ids (llama-server, vLLM, SGLang) do not tokenise again.
- Before the first request the server's model is checked against that tokenizer: ``/v1/models`` must list the model
  (``--server-model``, else the only one it serves), its vocabulary (where the server reports one, as llama-server
  does) must equal the tokenizer's, and the first answer must count as many prompt tokens as were sent.
- Up to ``concurrency`` requests are in flight; records are still written in input order (a finished response waits
  for the ones before it), flushed and fsynced, so a stop loses only the responses not yet written and a rerun
  resumes from the file without a duplicate or a gap.
- Transient failures (connection refused or dropped, timeouts, HTTP 408/409/429/5xx) are retried with exponential
  backoff (``retries`` times per request, 0.5 s doubling up to 30 s, with jitter); any other error stops the run with
  the prompt's id, after the records before it are written.
- Temperature 0 is greedy on the server. Two engines' numerics differ (a quantized GGUF differs from its
  dequantized weights, and kernels differ at near-ties), so the responses equal the local engine's on most records,
  not all: ``scripts/check_llamacpp.py`` measures the fraction. Sampled requests carry ``seed`` = the record's seed.
- ``all_turns``: a multi-turn prompt's turns are requests made one after another, each carrying the server's own
  earlier answers; the record is written once its last turn is answered.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from specheads.prompts import Prompt
from specheads.training.distill import (
    DistillResult,
    _encode,
    _model_input,
    _record,
    check_settings,
    check_unique_ids,
    read_finished,
    turn_seed,
    turns_asked,
    without_evaluation_prompts,
)

TRANSIENT_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ServerError(ConnectionError):
    """The server cannot be reached, serves another model, refused a request, or kept failing after every retry.

    A ``ConnectionError``: the command line prints it as one line, not a traceback."""


@dataclass(frozen=True)
class ServerModel:
    """The model a server serves, as its ``/v1/models`` describes it."""

    id: str
    vocab_size: int | None


def _client(url: str, timeout: float) -> Any:
    try:
        import openai
    except ImportError as error:  # pragma: no cover - openai is in the speculators extra
        raise ImportError("distill --server needs the openai client: pip install openai") from error
    base = url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    return openai.OpenAI(base_url=base, api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=0,
                         timeout=timeout)  # fmt: skip


def _transient(error: BaseException) -> bool:
    import openai

    if isinstance(error, (openai.APIConnectionError, openai.APITimeoutError)):  # refused, dropped, timed out
        return True
    return isinstance(error, openai.APIStatusError) and error.status_code in TRANSIENT_STATUS


def _hint(error: BaseException) -> str:
    """What to check when the server could not be reached at all."""
    import openai

    if isinstance(error, openai.APIConnectionError) and not isinstance(error, openai.APITimeoutError):
        return (
            " (nothing answered there: is the server running and listening on that host and port, e.g. "
            "llama-server --port, vllm serve --port? check --server)"
        )
    return ""


def with_retries(call: Any, retries: int, what: str, sleep: Any = time.sleep) -> Any:
    """``call()``, retried on transient errors with exponential backoff and jitter; the last error is raised."""
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as error:
            if not _transient(error) or attempt == retries:
                raise ServerError(f"{what}: {type(error).__name__}: {error}{_hint(error)}") from error
            sleep(min(30.0, 0.5 * 2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")  # pragma: no cover


def server_model(client: Any, tokenizer: PreTrainedTokenizerBase, model: str | None, retries: int) -> ServerModel:
    """The served model, checked against ``tokenizer`` (see the module docstring)."""
    listing = with_retries(lambda: client.models.list(), retries, f"GET {str(client.base_url).rstrip('/')}/models")
    models = list(listing.data)
    ids = [m.id for m in models]
    if model is None:
        if len(models) != 1:
            raise ServerError(f"the server serves {ids}; name one with --server-model")
        chosen = models[0]
    else:
        matching = [m for m in models if m.id == model]
        if not matching:
            raise ServerError(f"the server serves {ids}, not {model!r}")
        chosen = matching[0]
    extra = getattr(chosen, "model_extra", None) or {}
    meta = extra.get("meta") or {}
    vocab = meta.get("n_vocab")
    if vocab is not None and int(vocab) != len(tokenizer):
        raise ServerError(
            f"the server's model {chosen.id!r} has a vocabulary of {vocab} tokens and the tokenizer we train with "
            f"{len(tokenizer)}: its responses would be other token ids"
        )
    return ServerModel(chosen.id, int(vocab) if vocab is not None else None)


def distill_server(
    url: str,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    out_path: str | Path,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    concurrency: int = 4,
    retries: int = 5,
    model: str | None = None,
    timeout: float = 600.0,
    progress: bool = True,
    use_chat_template: bool = True,
    all_turns: bool = False,
    exclude_prompts: Sequence[str | Path] = (),
    allow_evaluation_prompts: bool = False,
) -> DistillResult:
    """Write the server's response to every prompt not yet in ``out_path`` (see the module docstring).

    Args:
        url: the server's address (``http://127.0.0.1:8080``, with or without ``/v1``).
        tokenizer: the tokenizer the heads are trained with; it renders and encodes the prompts.
        prompts: prompts with unique ids.
        out_path: the JSONL output; an existing file is resumed.
        max_new_tokens: ``max_tokens`` of each request.
        temperature, top_p: sampling (0 = greedy); sampled requests carry the record's seed.
        seed: with each record's id, the request's seed.
        concurrency: requests in flight at once (>= 1).
        retries: retries per request on transient errors.
        model: the served model's id (None: the only one the server lists).
        timeout: seconds per request.
        all_turns: answer every user turn of a multi-turn prompt, each request after the server's own earlier
            answers (one record per prompt, written once its last turn is answered); False: the first turn only.
        exclude_prompts, allow_evaluation_prompts: prompts that copy an evaluation prompt are skipped as
            :func:`~specheads.training.distill.distill` skips them.

    Returns:
        A :class:`~specheads.training.distill.DistillResult`; ``generate_time_s`` is the wall time of the requests.
    """
    check_settings(max_new_tokens, 1, temperature, top_p)
    if concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
    if retries < 0:
        raise ValueError(f"--retries must be >= 0, got {retries}")
    check_unique_ids(prompts)
    if not allow_evaluation_prompts:
        prompts = without_evaluation_prompts(prompts, exclude_prompts)
    out_path = Path(out_path)
    finished = read_finished(out_path)
    todo = [prompt for prompt in prompts if prompt.id not in finished]
    result = DistillResult()
    if not todo:
        return result
    client = _client(url, timeout)
    served = server_model(client, tokenizer, model, retries)
    written_by = {"engine": f"server {url} ({served.id})", "temperature": temperature, "seed": seed}
    # The first turns, rendered before any request: a prompt that cannot be rendered fails before the server is asked.
    first_inputs = [_model_input(prompt, tokenizer, use_chat_template) for prompt in todo]
    first_encoded = [_encode(tokenizer, first, prompt.id) for first, prompt in zip(first_inputs, todo, strict=True)]
    checked = threading.Event()

    def ask(prompt: Prompt, turn: int, encoded: list[int]) -> tuple[str, int]:
        body: dict[str, Any] = {"model": served.id, "prompt": encoded, "max_tokens": max_new_tokens,
                                "temperature": temperature, "top_p": top_p}  # fmt: skip
        if temperature > 0:
            body["seed"] = turn_seed(seed, prompt.id, turn) % 2**31
        answer = with_retries(lambda: client.completions.create(**body), retries, f"prompt {prompt.id!r}")
        usage = answer.usage
        if usage is not None and not checked.is_set():
            if usage.prompt_tokens != len(encoded):
                raise ServerError(
                    f"the server counted {usage.prompt_tokens} prompt tokens for the {len(encoded)} ids sent "
                    f"with prompt {prompt.id!r}: it does not read token-id prompts as the tokenizer we train with"
                )
            checked.set()
        return answer.choices[0].text, int(usage.completion_tokens) if usage is not None else 0

    def request(index: int) -> tuple[dict, int]:
        """The record of prompt ``index``: its turns asked one after another, each after the earlier answers."""
        prompt, answers, tokens = todo[index], [], 0
        for turn in range(turns_asked(prompt, all_turns)):
            if turn == 0:
                model_input, encoded = first_inputs[index], first_encoded[index]
            else:
                model_input = _model_input(prompt, tokenizer, use_chat_template, answers)
                encoded = _encode(tokenizer, model_input, prompt.id)
            text, count = ask(prompt, turn, encoded)
            answers.append(text)
            tokens += count
        return _record(prompt, model_input, answers, written_by), tokens

    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = len(prompts) - len(todo)
    bar = tqdm(total=len(prompts), initial=done, desc="distill (server)", unit="prompt", disable=not progress)
    start = time.perf_counter()
    ready: dict[int, tuple[dict, int]] = {}
    next_write, next_submit = 0, 0
    pending: dict[Future, int] = {}
    failure: BaseException | None = None
    with out_path.open("a", encoding="utf-8") as handle, bar, ThreadPoolExecutor(concurrency) as pool:
        while next_write < len(todo):
            while failure is None and next_submit < len(todo) and len(pending) < concurrency:
                pending[pool.submit(request, next_submit)] = next_submit
                next_submit += 1
            if not pending:
                break
            finished_now, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished_now:
                index = pending.pop(future)
                try:
                    ready[index] = future.result()
                except BaseException as error:  # noqa: BLE001 (re-raised once the records before it are written)
                    failure = failure or error
            written = 0
            while next_write in ready:
                record, tokens = ready.pop(next_write)
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                result.written += 1
                result.new_tokens += tokens
                next_write += 1
                written += 1
            if written:
                handle.flush()
                os.fsync(handle.fileno())
                bar.update(written)
            if failure is not None and not pending:
                break
    result.generate_time_s = time.perf_counter() - start
    if failure is not None:
        raise failure
    return result
