"""Self-distillation data: the base model's own responses to a set of prompts, as JSONL the trainer reads directly.

Heads learn to predict the base's next tokens, so they are best trained on text the base itself produces rather
than on human-written answers (Medusa, Cai et al. 2024, section 2.3.2 "self-distillation").

Each output line is one JSON object:
    ``id``, ``prompt`` (exactly the text the base was given: the chat-rendered prompt when a chat template is used,
    tokenised without added special tokens because the template writes its own, as everywhere in specheads, see
    :func:`specheads.prompts.render_conversation`; for a multi-turn ``"turns"`` record, its first turn, or with
    ``all_turns`` its last turn: the whole conversation so far), ``response`` (what it generated, cut before the
    first EOS token) and ``text`` = ``prompt + response``, read by the trainer's ``jsonl`` format; with a chat
    template also ``conversations`` = ``[{"from": "human", "value": <raw prompt>}, {"from": "gpt", "value":
    response}]`` (every turn, with ``all_turns``) for its ``sharegpt`` format; with ``all_turns`` and more than one
    turn, ``responses``: the answer to each turn in order (the last is ``response``).

Multi-turn conversations (``all_turns``, ``specheads distill --all-turns``): a ``"turns"`` record's user turns are
asked one after another, each after the base's own answers to the earlier ones, as MT-Bench asks its second turn
(and as ``specheads bench`` does), so the heads learn from the conversations the base itself leads. Turn k of every
row of a batch is generated together; a record is written once all its turns are answered.

Guarantees:
    - Resuming: an existing output file is read first; prompts whose id it holds are skipped and the rest appended.
      Records are flushed after every batch, so a crash loses at most one batch; a truncated last line left by a
      crash is reported, dropped and the file rewritten without it.
    - Greedy (temperature 0): each response is the base's own ``generate(do_sample=False)`` output for that prompt
      alone; batching with left padding changes nothing but floating-point rounding.
    - Sampling (temperature > 0): each record draws its tokens from its own generator seeded from ``(seed, id)``, so
      its response does not depend on the batch size, on the other prompts, their order, ``--limit`` or on resuming
      (up to the same floating-point rounding of batched forwards, which can move a draw only at a boundary).
    - Evaluation prompts stay out: a prompt that copies one (:mod:`specheads.contamination`) is skipped and counted
      unless ``allow_evaluation_prompts`` (:func:`without_evaluation_prompts`).

Speculation (``decoder=``, ``specheads distill --heads / --draft-model``): every batch is decoded by the batched
speculative engine instead of transformers' ``generate``; records, resuming and the cut at stop tokens are the same.
    - Greedy: the engine's output is the base's own greedy output token for token, so the file is the one plain
      decoding writes (the same floating-point caveat as batching; tested equal on the tiny test models and checked
      on the default model by ``scripts/bench_distill.py``). Only the time differs.
    - Sampling: lossless in distribution (rejection sampling, Leviathan et al. 2023; Chen et al. 2023), and each
      record is still seeded from ``(seed, id)``, so it is reproducible and independent of batching and resuming, but
      the engine consumes its random numbers differently from the plain path's sampler: the same seed gives other
      (equally distributed) responses with and without speculation, and with different drafters or trees.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from specheads.contamination import evaluation_index
from specheads.inference.generation import GenerationConfig
from specheads.inference.sampling import SamplingParams, probabilities, sample
from specheads.loading import eos_token_ids, pad_token_id
from specheads.metrics import SpecStats
from specheads.prompts import Prompt, PromptFileError, chat_text, encode_chat_text, has_chat_template

if TYPE_CHECKING:
    from specheads.inference.decoder import SpecDecoder

logger = logging.getLogger(__name__)

_SHAREGPT_FROM = {"user": "human", "assistant": "gpt", "system": "system"}


@dataclass
class DistillResult:
    """What one :func:`distill` call did.

    Attributes:
        written: records appended by this call (prompts already in the file are not counted).
        new_tokens: response tokens written (after the cut at the first stop token, which is not counted).
        generate_time_s: seconds spent generating (tokenizing and writing excluded).
        spec_stats: the speculative engine's totals over every batch (tau, acceptance); None without speculation.
    """

    written: int = 0
    new_tokens: int = 0
    generate_time_s: float = 0.0
    spec_stats: SpecStats | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.generate_time_s if self.generate_time_s > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        """tau over the whole run (tokens per base forward, EOS included); None without speculation."""
        return None if self.spec_stats is None else self.spec_stats.mean_accepted_length


@dataclass(frozen=True)
class _ModelInput:
    text: str  # what the base is given
    templated: bool  # rendered with a chat template (which brings its own special tokens)
    turns: list[dict[str, str]] | None  # ShareGPT turns before the response; None without a chat template


def check_settings(
    max_new_tokens: int, batch_size: int, temperature: float, top_p: float = 1.0, top_k: int = 0
) -> SamplingParams:
    """Validate the generation settings; raise ``ValueError`` with the offending option."""
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)


def without_evaluation_prompts(
    prompts: Sequence[Prompt], exclude: Sequence[str | Path] = (), log: Callable[[str], None] = logger.warning
) -> list[Prompt]:
    """``prompts`` without those that copy an evaluation prompt, the skipped ones counted in one line to ``log``.

    A prompt copies one when any of its user texts (every turn of a conversation, the follow-ups ``all_turns``
    asks included) shares a run of words with a prompt of :func:`specheads.contamination.evaluation_index`: the
    installed evaluation sets, the shipped prompt files and the JSONL files ``exclude`` names.

    Raises:
        ValueError: every prompt copies an evaluation prompt.
        FileNotFoundError: a file of ``exclude`` does not exist.
    """
    index = evaluation_index(exclude)
    kept, dropped = [], Counter()
    for prompt in prompts:
        if prompt.conversation is None:
            texts = [prompt.text]
        else:
            texts = [content for role, content in prompt.conversation if role == "user"] + list(prompt.followups)
        source = index.match(texts)
        if source is None:
            kept.append(prompt)
        else:
            dropped[source] += 1
    if dropped:
        sources = ", ".join(f"{name} x{count}" for name, count in dropped.most_common())
        log(f"{sum(dropped.values())} prompts skipped: they copy evaluation prompts ({sources}); "
            "--allow-evaluation-prompts (allow_evaluation_prompts=True) keeps them")  # fmt: skip
    if not kept:
        raise ValueError(
            "every prompt copies an evaluation set; distill other prompts, or pass --allow-evaluation-prompts "
            "(allow_evaluation_prompts=True)"
        )
    return kept


def check_unique_ids(prompts: Sequence[Prompt]) -> None:
    """Raise ``PromptFileError`` (a ``ValueError``) naming the first id that appears twice."""
    seen: set[str] = set()
    for prompt in prompts:
        if prompt.id in seen:
            raise PromptFileError(
                f"prompt id {prompt.id!r} appears more than once; distill needs unique ids to resume "
                "(records without an 'id' get their 0-based index)"
            )
        seen.add(prompt.id)


def read_finished(out_path: str | Path) -> set[str]:
    """The ids already in a distillation output file (empty when it does not exist).

    A last line that is not valid JSON (a crash mid-write) is reported, dropped and the file rewritten without it;
    a bad line elsewhere, a record without ``"id"`` or a repeated id raise ``ValueError`` naming ``file:line``.
    """
    path = Path(out_path)
    if not path.exists():
        return set()
    chunks = path.read_bytes().split(b"\n")
    ends_with_newline = chunks[-1] == b""
    if ends_with_newline:
        chunks.pop()
    finished: set[str] = set()
    kept: list[bytes] = []
    for number, chunk in enumerate(chunks, start=1):
        if not chunk.strip():
            continue
        try:
            record = json.loads(chunk.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            if number < len(chunks):
                raise ValueError(f"{path}:{number}: not valid JSON ({error}); not a distill output?") from error
            logger.warning("%s:%d: dropping a truncated last line (an interrupted run); regenerating it", path, number)
            continue
        if not isinstance(record, dict) or "id" not in record:
            raise ValueError(f"{path}:{number}: not a distill record (a JSON object with an 'id')")
        record_id = str(record["id"])
        if record_id in finished:
            raise ValueError(f"{path}:{number}: id {record_id!r} appears twice")
        finished.add(record_id)
        kept.append(chunk)
    if len(kept) != len(chunks) or (chunks and not ends_with_newline):
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_bytes(b"".join(chunk + b"\n" for chunk in kept))
        os.replace(temporary, path)
    return finished


def turns_asked(prompt: Prompt, all_turns: bool) -> int:
    """How many of ``prompt``'s turns distill answers: all of them with ``all_turns``, else the first."""
    return prompt.num_turns if all_turns else 1


def turn_seed(seed: int, prompt_id: str, turn: int) -> int:
    """The sampling seed of a record's turn ``turn`` (0-based): the record's own seed at its first turn."""
    return record_seed(seed, prompt_id if turn == 0 else f"{prompt_id}\x00turn {turn + 1}")


def record_seed(seed: int, prompt_id: str) -> int:
    """The seed of one record's sampling generator: a stable hash of ``(seed, id)``."""
    digest = hashlib.sha256(f"{seed}\0{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class PerRowSampler(LogitsProcessor):
    """Sample each batch row with its own ``torch.Generator``, so a row's tokens do not depend on its batch.

    transformers' sampling draws the whole batch from one global generator; here greedy ``generate`` runs with this
    processor last, which draws each row's token (temperature, top-k, top-p as in
    :func:`specheads.inference.sampling.warp_logits`) and leaves only that token finite for the argmax to pick.
    """

    def __init__(self, params: SamplingParams, seeds: Sequence[int]) -> None:
        self.params = params
        self.seeds = list(seeds)
        self.generators: list[torch.Generator] | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.generators is None:
            self.generators = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        probs = probabilities(scores, self.params)  # [B, V]
        chosen = torch.stack([sample(probs[row], gen) for row, gen in enumerate(self.generators)])  # [B]
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(1, chosen[:, None], 0.0)


def distill(
    base_model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    out_path: str | Path,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = True,
    use_chat_template: bool = True,
    decoder: SpecDecoder | None = None,
    decoder_options: Mapping[str, Any] | None = None,
    all_turns: bool = False,
    exclude_prompts: Sequence[str | Path] = (),
    allow_evaluation_prompts: bool = False,
) -> DistillResult:
    """Generate the base's own response to every prompt not yet in ``out_path`` and append the records.

    Prompts that copy an evaluation prompt are skipped (counted in a warning; see
    :func:`without_evaluation_prompts`) unless ``allow_evaluation_prompts``: heads trained on a benchmark's
    questions measure memory, not speculation.

    Args:
        base_model: the base, in eval mode.
        tokenizer: its tokenizer; a chat template (unless ``use_chat_template`` is False) wraps plain prompts.
        prompts: prompts with unique ids (see :func:`specheads.prompts.load_prompts`).
        out_path: the JSONL output; an existing file is resumed (see the module docstring).
        max_new_tokens: at most this many generated tokens per response.
        temperature: 0 is greedy; otherwise sampled with ``top_p`` / ``top_k`` (0 disables top-k).
        batch_size: prompts per ``generate`` call (left-padded without a decoder; rows of their own length with one).
        seed: with ``id``, seeds each record's sampling generator.
        progress: show a tqdm bar over the prompts.
        use_chat_template: render plain prompts with the tokenizer's chat template when it has one.
        decoder: a :class:`~specheads.inference.decoder.SpecDecoder` wrapping ``base_model`` itself (e.g.
            ``SpecDecoder.from_pretrained(base_model, heads=...)``): batches are decoded speculatively, which at
            temperature 0 writes the same file faster (see the module docstring for sampling). None: transformers'
            ``generate``.
        decoder_options: further keyword arguments of ``decoder.generate`` (``tree``, ``num_speculative_tokens``,
            ...); the sampling settings, seeds and stop tokens are distill's own.
        all_turns: answer every user turn of a multi-turn (``"turns"``) prompt, each after the base's own earlier
            answers (sampled turns after the first are seeded from ``(seed, id, turn)``); False: the first turn only.
        exclude_prompts: JSONL prompt files a prompt must not copy either, besides the installed evaluation sets and
            the shipped prompt files.
        allow_evaluation_prompts: distill prompts that copy an evaluation prompt too.

    Returns:
        A :class:`DistillResult`: records written by this call, tokens, generation time and, with a decoder, tau.

    Raises:
        ValueError: bad settings, a decoder on another model, repeated ids, or every prompt copies an evaluation
            prompt (unless ``allow_evaluation_prompts``); nothing is written then.
    """
    params = check_settings(max_new_tokens, batch_size, temperature, top_p, top_k)
    options = _check_decoder(base_model, decoder, decoder_options)
    check_unique_ids(prompts)
    if not allow_evaluation_prompts:
        prompts = without_evaluation_prompts(prompts, exclude_prompts)
    out_path = Path(out_path)
    finished = read_finished(out_path)
    todo = [prompt for prompt in prompts if prompt.id not in finished]
    stop_ids = sorted(eos_token_ids(base_model, tokenizer))  # as the decoder resolves them
    pad_id = pad_token_id(base_model, tokenizer)
    if pad_id is None and decoder is None:
        raise ValueError("the tokenizer has neither a pad token nor an EOS token to pad batches with")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = len(prompts) - len(todo)
    bar = tqdm(total=len(prompts), initial=done, desc="distill", unit="prompt", disable=not progress)
    result = DistillResult(spec_stats=None if decoder is None else SpecStats())
    written_by = provenance(base_model, decoder, params, seed)
    with out_path.open("a", encoding="utf-8") as handle, bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            answers: list[list[str]] = [[] for _ in batch]
            inputs: list[_ModelInput | None] = [None] * len(batch)  # each row's input at its last turn
            for turn in range(max(turns_asked(prompt, all_turns) for prompt in batch)):
                rows = [i for i, prompt in enumerate(batch) if turns_asked(prompt, all_turns) > turn]
                for i in rows:
                    inputs[i] = _model_input(batch[i], tokenizer, use_chat_template, answers[i])
                encoded = [_encode(tokenizer, inputs[i], batch[i].id) for i in rows]
                seeds = None if params.greedy else [turn_seed(seed, batch[i].id, turn) for i in rows]
                tick = time.perf_counter()
                if decoder is None:
                    sampler = None if seeds is None else PerRowSampler(params, seeds)
                    new_tokens = _generate_batch(base_model, encoded, max_new_tokens, stop_ids, pad_id, sampler)
                else:
                    new_tokens, stats = _speculate_batch(
                        decoder, encoded, max_new_tokens, stop_ids, params, seeds, options
                    )
                    result.spec_stats = result.spec_stats.merge(stats)
                result.generate_time_s += time.perf_counter() - tick
                result.new_tokens += sum(len(tokens) for tokens in new_tokens)
                for i, tokens in zip(rows, new_tokens, strict=True):
                    text = tokenizer.decode(tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False)
                    answers[i].append(text)
            for prompt, model_input, responses in zip(batch, inputs, answers, strict=True):
                handle.write(json.dumps(_record(prompt, model_input, responses, written_by), ensure_ascii=False) + "\n")
            handle.flush()  # a crash loses at most this batch
            os.fsync(handle.fileno())
            result.written += len(batch)
            bar.update(len(batch))
    return result


def speculative_decoder(
    base_model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    heads: str | Path | None = None,
    draft_model: str | Path | None = None,
    base_name: str | Path | None = None,
) -> SpecDecoder:
    """The ``decoder`` of :func:`distill`: ``base_model`` itself with ``heads`` (a checkpoint directory of any
    method, or ``"default"``: the heads shipped for ``base_name``) or else ``draft_model``.

    Raises:
        ValueError: Medusa-2 heads, which decode the base with their LoRA adapter merged: the data would not be the
            base's own.
    """
    from specheads.heads.loading import ADAPTER_DIR, heads_path
    from specheads.inference.decoder import SpecDecoder

    if heads is None:
        return SpecDecoder.from_pretrained(base_model, draft_model=draft_model, tokenizer=tokenizer)
    heads = Path(heads_path(heads, base_name))
    if (heads / ADAPTER_DIR).is_dir():
        raise ValueError(
            f"{heads} are Medusa-2 heads: they decode the base with their LoRA adapter merged, so the data would "
            "not be --base's own; distill with the merged base as --base, or without --heads"
        )
    return SpecDecoder.from_pretrained(base_model, heads=heads, tokenizer=tokenizer)


# The GenerationConfig fields distill sets from its own arguments (decoder_options may set the others).
_DISTILL_OWN_OPTIONS = frozenset({"max_new_tokens", "temperature", "top_p", "top_k", "seed", "eos_token_id"})


def _check_decoder(
    base_model: PreTrainedModel, decoder: SpecDecoder | None, decoder_options: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The decoder must decode ``base_model`` itself: distillation data are that model's outputs, nobody else's."""
    options = dict(decoder_options or {})
    if decoder is None:
        if options:
            raise ValueError(f"decoder_options {sorted(options)} need a decoder")
        return options
    if decoder.model is not base_model:
        raise ValueError(
            "the decoder wraps another model than base_model; build it on the same object, e.g. "
            "SpecDecoder.from_pretrained(base_model, heads=...)"
        )
    clashes = sorted((_DISTILL_OWN_OPTIONS | {"batch_size"}) & set(options))
    if clashes:
        raise ValueError(f"decoder_options may not set {clashes}: distill sets them from its own arguments")
    decoder.check(**options)  # unknown keywords and bad values, before any record is decoded
    return options


def _encode(tokenizer: PreTrainedTokenizerBase, model_input: _ModelInput, prompt_id: str) -> list[int]:
    """A prompt's token ids: a chat-template rendering through :func:`specheads.prompts.encode_chat_text` (the
    template wrote the special tokens, BOS included), as the decoder and bench tokenise it; a plain prompt with the
    tokenizer's special tokens."""
    if model_input.templated:
        token_ids = encode_chat_text(tokenizer, model_input.text)
    else:
        token_ids = tokenizer(model_input.text)["input_ids"]
    if not token_ids:
        raise ValueError(f"prompt {prompt_id!r} encodes to no tokens")
    return token_ids


@torch.inference_mode()
def _generate_batch(
    model: PreTrainedModel,
    encoded: Sequence[list[int]],
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
    sampler: LogitsProcessor | None,
) -> list[list[int]]:
    """One left-padded transformers ``generate`` call; returns each row's new tokens, cut before the first stop."""
    width = max(len(token_ids) for token_ids in encoded)
    input_ids = torch.tensor([[pad_id] * (width - len(t)) + t for t in encoded], device=model.device)  # [B, T]
    attention_mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in encoded], device=model.device)
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,  # sampling, when asked for, is PerRowSampler's; the model's own sampling defaults do not apply
        num_beams=1,
        temperature=None,
        top_p=None,
        top_k=None,
        eos_token_id=stop_ids or None,
        pad_token_id=pad_id,
        logits_processor=LogitsProcessorList([sampler]) if sampler is not None else None,
        return_dict_in_generate=False,
    )
    return [_cut_at_stop(row.tolist(), stop_ids) for row in output[:, width:]]  # [B, new] -> lists


def _speculate_batch(
    decoder: SpecDecoder,
    encoded: Sequence[list[int]],
    max_new_tokens: int,
    stop_ids: list[int],
    params: SamplingParams,
    seeds: list[int] | None,
    options: Mapping[str, Any],
) -> tuple[list[list[int]], SpecStats]:
    """One batched speculative ``generate`` call; each row's new tokens cut before the first stop, and the totals.

    Rows keep their own lengths (no padding) and each is seeded with its record's seed, so a row draws what it would
    draw alone.
    """
    config = GenerationConfig.from_kwargs(
        max_new_tokens=max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=seeds,
        eos_token_id=stop_ids,  # [] (no stop token) stops nothing, as in the plain path
        **options,
    )
    out = decoder.generate(list(encoded), generation_config=config)
    return [_cut_at_stop(row.new_tokens, stop_ids) for row in out], out.stats


def _cut_at_stop(tokens: list[int], stop_ids: list[int]) -> list[int]:
    # Only the first stop token ends a response: generate pads finished rows after it, and a pad id may be a real token.
    for index, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[:index]
    return tokens


def _model_input(
    prompt: Prompt, tokenizer: PreTrainedTokenizerBase, use_chat_template: bool, answers: Sequence[str] = ()
) -> _ModelInput:
    """What the base is given for ``prompt`` at turn ``len(answers) + 1``, rendered by
    :func:`specheads.prompts.chat_text` when templated.

    A conversation (``"conversations"`` or ``"turns"`` record) is always templated; a multi-turn prompt's turn k
    follows the base's own ``answers`` to the turns before it (:meth:`specheads.prompts.Prompt.messages`). A plain
    prompt is wrapped as one user message when ``use_chat_template`` and the tokenizer has a template.
    """
    messages = prompt.messages(answers)
    if messages is not None:
        turns = [{"from": _SHAREGPT_FROM[m["role"]], "value": m["content"]} for m in messages]
        return _ModelInput(chat_text(tokenizer, messages), True, turns)
    if use_chat_template and has_chat_template(tokenizer):
        text = chat_text(tokenizer, [{"role": "user", "content": prompt.text}])
        return _ModelInput(text, True, [{"from": "human", "value": prompt.text}])
    return _ModelInput(prompt.text, False, None)


def _record(prompt: Prompt, model_input: _ModelInput, responses: Sequence[str], provenance: Mapping[str, Any]) -> dict:
    """The record of ``prompt`` answered with ``responses`` (one per turn asked); ``model_input`` is its last turn's."""
    response = responses[-1]
    record = {"id": prompt.id, "prompt": model_input.text, "response": response, "text": model_input.text + response}
    if len(responses) > 1:
        record["responses"] = list(responses)
    if model_input.turns is not None:
        record["conversations"] = [*model_input.turns, {"from": "gpt", "value": response}]
    record["provenance"] = dict(provenance)
    return record


def build_record(
    prompt: Prompt,
    tokenizer: PreTrainedTokenizerBase,
    response: str | Sequence[str],
    provenance: Mapping[str, Any],
    use_chat_template: bool = True,
) -> dict:
    """The record ``distill`` (and ``distill --server``) writes for ``prompt`` answered with ``response`` (a
    multi-turn prompt's answers, one per turn asked, as a list).

    A saved response and its provenance become a training record again (``scripts/distilled_shards.py``), with the
    prompt rendered as distill renders it.

    Raises:
        ValueError: no answer, or more answers than the prompt has turns.
    """
    responses = [response] if isinstance(response, str) else list(response)
    if not responses:
        raise ValueError(f"prompt {prompt.id!r}: no answer to build a record from")
    model_input = _model_input(prompt, tokenizer, use_chat_template, responses[:-1])
    return _record(prompt, model_input, responses, provenance)


def provenance(base_model: PreTrainedModel, decoder: SpecDecoder | None, params: SamplingParams, seed: int) -> dict:
    """What wrote a record: the engine (transformers' ``generate`` or specheads' engine and its drafter), the
    base's dtype and device, the sampling settings and the seed (sampled records are seeded from it and their id)."""
    engine = "transformers.generate" if decoder is None else f"specheads ({decoder.drafter.name})"
    parameter = next(base_model.parameters())
    return {
        "engine": engine,
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "device": parameter.device.type,
        "temperature": params.temperature,
        "seed": seed,
    }
