"""Chat templates and assistant targets: which characters of a rendered conversation are training targets, and which
tokens overlap them (the loss mask).

:func:`chat_template` and :func:`chat_renderer` give the template conversations are rendered with.
:func:`assistant_spans` checks a conversation turn by turn (the template must be prefix-stable) and returns the
``[start, end)`` character spans of its assistant targets: each turn's content and end-of-turn marker. A
:class:`Skeleton` (:func:`skeleton_of`) gives the same spans from a single rendering for every conversation with one
sequence of roles. :func:`tokenize_with_targets` tokenises rendered conversations and marks the tokens that overlap
a span, tokenising a long text only up to an end-of-turn token (:func:`cut_token_for`) where that gives the same
ids. The rules are in :mod:`specheads.training.data`'s docstring.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from specheads.training.config import DataConfig
from specheads.training.errors import DataError

_SENTINEL = "SpecheadsSentinel7f3a"  # stands in for an assistant message to find the template's header and end marker
_CHARS_PER_TOKEN = 8  # a conversation is tokenised up to about this many characters per max_length token
# Ids and character offsets only: converting the attention mask of every text too costs ~7% of the tokenising time.
_OFFSETS = dict(add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False, verbose=False)
Renderer = Callable[[list[dict[str, str]], bool], str]


def chat_template(config: DataConfig, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """``config.chat_template`` as template text (it may name a file holding one); None: the tokenizer's own."""
    template = config.chat_template
    if template is not None and "{{" not in template and "{%" not in template:
        path = Path(template).expanduser()
        if not path.is_file():
            raise DataError(f"data.chat_template {template!r} is neither a Jinja template nor an existing file")
        template = path.read_text(encoding="utf-8")
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "format sharegpt needs a chat template, but the tokenizer has none; set data.chat_template to a Jinja "
            "template or a file holding one"
        )
    return template


def chat_renderer(tokenizer: PreTrainedTokenizerBase, template: str | None) -> Renderer:
    """``render(messages, add_generation_prompt) -> str`` with ``template`` (None: the tokenizer's)."""

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    return render


def _marker(index: int) -> str:
    return f"{_SENTINEL}{index}Z"  # no marker is a prefix of another


def template_takes_system(render: Renderer) -> bool:
    """Whether the template renders a first system turn (it neither raises on one nor leaves its content out)."""
    roles = ("system", "user", "assistant")
    try:
        text = render([{"role": role, "content": _marker(i)} for i, role in enumerate(roles)], False)
    except (TemplateError, ValueError, TypeError):
        return False
    return _marker(0) in text


@dataclass(frozen=True)
class Skeleton:
    """The text a template writes around the contents of conversations with one sequence of roles."""

    pieces: tuple[str, ...]  # pieces[k] comes before content k, pieces[-1] after the last one
    tails: tuple[int | None, ...]  # per turn: None, or for an assistant turn the length of its end marker

    def spans(self, text: str, messages: list[dict[str, str]]) -> list[tuple[int, int]] | None:
        """The target spans of ``text``, the rendering of ``messages``; None unless ``text`` is exactly this skeleton
        with the messages' contents put in."""
        spans = []
        position = 0
        for piece, message, tail in zip(self.pieces[:-1], messages, self.tails, strict=True):
            content = message["content"]
            if not text.startswith(piece, position) or not text.startswith(content, position + len(piece)):
                return None
            position += len(piece)
            if tail is not None and len(content) + tail > 0:
                spans.append((position, position + len(content) + tail))
            position += len(content)
        last = self.pieces[-1]
        return spans if len(text) == position + len(last) and text.startswith(last, position) else None


def skeleton_of(roles: tuple[str, ...], render: Renderer, where: str) -> Skeleton | None:
    """The skeleton of ``roles`` from a stand-in conversation checked turn by turn (:func:`assistant_spans`);
    None when the template drops or rewrites contents, or targets more than content + end marker."""
    markers = [_marker(index) for index in range(len(roles))]
    full, spans = assistant_spans(
        [{"role": role, "content": marker} for role, marker in zip(roles, markers, strict=True)], render, where
    )
    span_ends = dict(spans)  # start -> end
    pieces, tails = [], []
    position = 0
    for role, marker in zip(roles, markers, strict=True):
        found = full.find(marker, position)
        if found < 0:
            return None
        pieces.append(full[position:found])
        position = found + len(marker)
        if role != "assistant":
            tails.append(None)
        elif span_ends.get(found, -1) >= position:
            tails.append(span_ends.pop(found) - position)
        else:
            return None
    if span_ends:
        return None
    pieces.append(full[position:])
    return Skeleton(tuple(pieces), tuple(tails))


def assistant_spans(messages: list[dict[str, str]], render: Renderer, where: str) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the ``[start, end)`` character spans of its assistant targets.

    For assistant turn ``i``: ``before`` = turns ``< i`` with the generation prompt, ``through`` = turns ``<= i``.
    The turn's text is ``through[len(before):]``; rendering a sentinel in place of the content tells which part of
    that text is a header (before the content) and which the end marker (after it).
    """
    full = render(messages, False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(messages[:index], True) if index else ""
        through = render(messages[: index + 1], False)
        sentinel = render(messages[:index] + [{"role": "assistant", "content": _SENTINEL}], False)
        if not (through.startswith(before) and sentinel.startswith(before) and full.startswith(through)):
            raise DataError(
                f"{where}: the chat template is not prefix-stable at turn {index} (rendering the conversation up to "
                "a turn is not a prefix of rendering it further), so assistant tokens cannot be located"
            )
        turn, sentinel_turn = through[len(before) :], sentinel[len(before) :]
        header, found, footer = sentinel_turn.partition(_SENTINEL)
        if not found or not turn.startswith(header) or not turn.endswith(footer):
            header, footer = "", ""  # the template rewrites content: target the whole turn
        start = len(before) + len(header)
        end = len(through) - len(footer) + len(footer.rstrip())  # content + end marker, not the whitespace after
        if end > start:
            spans.append((start, end))
    return full, spans


def end_marker_of(render: Renderer) -> str:
    """What the template writes after an assistant turn's content as part of the turn (e.g. ``<|im_end|>``); "" when
    a stand-in conversation does not tell (the conversations themselves then say what is wrong)."""
    try:
        probe = skeleton_of(("user", "assistant"), render, "the chat template")
    except (TemplateError, ValueError, TypeError):  # DataError is a ValueError
        return ""
    return probe.pieces[2][: probe.tails[1]] if probe is not None else ""


# --------------------------------------------------------------------------------------------------- tokens and targets


def cut_token_for(tokenizer: PreTrainedTokenizerBase, end_marker: str) -> str | None:
    """The added token that ends the template's assistant end marker, if a text may be cut right after it.

    A fast tokenizer splits added tokens out before anything else, so the ids of ``text[:cut]``, cut right after one,
    are the first ids of ``text`` -- unless the token matches only as a single word, or another added token holds it
    (a longer match could run past the cut).
    """
    if not end_marker or not getattr(tokenizer, "is_fast", False):
        return None
    added = list(tokenizer.added_tokens_decoder.values())
    for token in added:
        others = (other.content for other in added if other.content != token.content)
        usable = token.special and not token.single_word and token.content and end_marker.endswith(token.content)
        if usable and not any(token.content in other for other in others):
            return token.content
    return None


def tokenize_with_targets(
    texts: list[str],
    spans: list[list[tuple[int, int]]],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    cut_token: str | None = None,
) -> tuple[list[list[int]], list[np.ndarray]]:
    """The first ``max_length`` token ids of each text (no added special tokens: the template wrote them) and an
    int8 array, 1 where a token overlaps one of the text's spans.

    With ``cut_token`` (see :func:`cut_token_for`) a long text is tokenised only up to the first ``cut_token`` after
    ``_CHARS_PER_TOKEN * max_length`` characters, and whole where that gave fewer than ``max_length`` ids.
    """
    if not texts:
        return [], []
    if getattr(tokenizer, "is_fast", False):
        cuts = [_cut_at(text, cut_token, _CHARS_PER_TOKEN * max_length) for text in texts]
        encoding = tokenizer([text[:cut] for text, cut in zip(texts, cuts, strict=True)], **_OFFSETS)
        ids, offsets = list(encoding["input_ids"]), list(encoding["offset_mapping"])
        short = [i for i, row in enumerate(ids) if len(row) < max_length and cuts[i] < len(texts[i])]
        if short:  # cut too early: these are tokenised whole
            whole = tokenizer([texts[i] for i in short], **_OFFSETS)
            for i, row_ids, row_offsets in zip(short, whole["input_ids"], whole["offset_mapping"], strict=True):
                ids[i], offsets[i] = row_ids, row_offsets
        masks = [_overlaps(row[:max_length], row_spans) for row, row_spans in zip(offsets, spans, strict=True)]
        return [row[:max_length] for row in ids], masks
    # No offsets: tokenise the pieces between span boundaries separately.
    all_ids, all_targets = [], []
    for text, text_spans in zip(texts, spans, strict=True):
        ids: list[int] = []
        targets: list[int] = []
        position = 0
        for span_start, span_end in [*text_spans, (len(text), len(text))]:
            for piece, is_target in ((text[position:span_start], 0), (text[span_start:span_end], 1)):
                if piece:
                    piece_ids = tokenizer(piece, add_special_tokens=False, verbose=False)["input_ids"]
                    ids += piece_ids
                    targets += [is_target] * len(piece_ids)
            position = span_end
        all_ids.append(ids[:max_length])
        all_targets.append(np.asarray(targets[:max_length], dtype=np.int8))
    return all_ids, all_targets


def _cut_at(text: str, cut_token: str | None, start: int) -> int:
    """Just after the first ``cut_token`` at or after ``start``; ``len(text)`` without one."""
    found = text.find(cut_token, start) if cut_token is not None and len(text) > start else -1
    return len(text) if found < 0 else found + len(cut_token)


def _overlaps(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    """``[T]`` int8: 1 where token ``t``'s characters ``[start, end)`` overlap one of the sorted, disjoint spans."""
    flat = np.fromiter(itertools.chain.from_iterable(offsets), dtype=np.int64, count=2 * len(offsets))
    bounds = flat.reshape(-1, 2)  # [T, 2]
    span_starts, span_ends = np.asarray(spans, dtype=np.int64).reshape(-1, 2).T  # [S] each
    # The first span that ends after the token starts; the token overlaps it when that span starts before it ends.
    first = np.searchsorted(span_ends, bounds[:, 0], side="right")  # [T]
    inside = first < len(span_ends)
    hits = np.zeros(len(bounds), dtype=np.int8)
    hits[inside] = span_starts[first[inside]] < bounds[inside, 1]
    return hits
