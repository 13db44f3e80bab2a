"""Prompt lookup as a second source for any drafter: both sources' drafts in one tree, verified by one forward.

Text repeats itself: code repeats names and lines, chat answers loop, extraction copies the prompt. A model-free
lookup (the longest suffix of the context that occurred before, and what followed it; Saxena 2023, SuffixDecoding
arXiv 2411.04975) is right at positions where a learned drafter is often wrong, and the other way round.
:class:`WithLookup` wraps any :class:`~specheads.inference.drafters.Drafter`: each step it asks the drafter for its
tree as usual, looks up each row's context, and grafts the lookup's continuations onto the drafter's tree as extra
branches from the root, merged where they share a prefix with the drafter's nodes. The base verifies the merged
tree in the same forward; the engine's acceptance rule does not know which source drafted which node.

Lossless in every mode: at temperature 0 the accepted path is the base's greedy path whatever the tree holds; with
``acceptance="rejection"`` a lookup node is a deterministic draft (a point mass: its draft probability is one-hot),
independent of the drafter's random draws, so tree rejection sampling stays exact with siblings from both sources.

The drafter's own state stays consistent whatever was accepted: drafters that rebuild from the committed tokens and
the base's features (EAGLE, DFlash, Medusa) do so unchanged; a drafter that keeps drafted tokens in a cache (the
draft model) is told how many of the accepted tokens lie on its own proposal, and feeds the rest as committed tokens.

How much each source proposes: the lookup proposes, per match length n, ``tokens_by_match[n]`` tokens (0: nothing),
for up to ``candidates`` distinct continuations (the most recent occurrences of the longest match first, then
shorter matches). ``calibrate --prompt-lookup`` measures the acceptance of lookup tokens by match length on the
calibration prompts and stores the table with the heads' calibration (``tree.json``); without one the defaults
below hold. ``skip_drafter_at``: from that match length on (in every row of the step), the drafter does not draft
for the step; the lookup's branches alone are verified. It saves what the drafter pays per step (the draft model's
forward per drafted token, a head's forward per level) where the lookup is likely right on its own; off by default.

An optional corpus of earlier outputs (``PromptLookup.corpus``: a JSONL file, :func:`read_corpus`, or token lists)
is indexed once per decoder (:class:`CorpusIndex`, as SuffixDecoding's global tree) and looked up beside each row's
own text. Of a corpus match, the proposed continuation is the one most of its occurrences follow. The rule between
the two sources: the longer match comes first; at equal length the row's own continuations come first (its own text
is the better guide to how it goes on); duplicates are dropped and ``candidates`` caps the two together.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specheads.inference import kv_cache
from specheads.inference.drafters import Drafter
from specheads.inference.state import DecodeState, DraftRequest, Proposal, rows_of
from specheads.inference.trees import TreeBuffers, tree_from_parents

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Tokens proposed for a suffix match of length n (index n; lengths beyond the table use its last entry): nothing for a
# single repeated token, more the longer the match. The held-out SmolLM2 answers continue a repeated 4-gram correctly
# 91% of the time, so long matches earn long branches.
DEFAULT_TOKENS_BY_MATCH = (0, 0, 4, 6, 8)


@dataclass(frozen=True)
class PromptLookup:
    """Settings of the lookup source (see the module).

    Attributes:
        max_ngram: the longest context suffix looked up.
        min_ngram: the shortest suffix match that proposes.
        candidates: distinct continuations (branches) proposed per step at most.
        tokens_by_match: tokens proposed for a match of length n, at index n (the last entry serves longer matches).
        skip_drafter_at: a match of at least this length in every row makes the drafter skip the step (None: never).
        corpus: earlier outputs looked up beside each row's own text (see the module): a JSONL file
            (:func:`read_corpus`; its texts are tokenised once, with the decoder's tokenizer) or token lists; None
            (default): the row's own text only. Not part of :meth:`record` (a calibration stores no paths). Off by
            default because, on MT-Bench with SmolLM2-135M in bf16, the 9,257 distilled SmolLM2 answers raised tau
            (lookup alone 1.73 to 2.20, EAGLE + lookup 2.38 to 2.63) but not clearly tokens/s: a corpus match
            nearly always exists, and its branches enlarge every step's tree.
    """

    max_ngram: int = 8
    min_ngram: int = 2
    candidates: int = 2
    tokens_by_match: tuple[int, ...] = DEFAULT_TOKENS_BY_MATCH
    skip_drafter_at: int | None = None
    corpus: str | Path | tuple[tuple[int, ...], ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"PromptLookup needs 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.candidates < 1:
            raise ValueError(f"PromptLookup.candidates must be >= 1, got {self.candidates}")
        tokens = tuple(int(t) for t in self.tokens_by_match)
        if not tokens or min(tokens) < 0:
            raise ValueError(f"PromptLookup.tokens_by_match must be non-negative counts, got {self.tokens_by_match}")
        object.__setattr__(self, "tokens_by_match", tokens)
        if self.skip_drafter_at is not None and self.skip_drafter_at < self.min_ngram:
            raise ValueError(f"PromptLookup.skip_drafter_at must be >= min_ngram, got {self.skip_drafter_at}")
        if self.corpus is not None and not isinstance(self.corpus, (str, Path)):
            texts = tuple(text if isinstance(text, tuple) else tuple(int(t) for t in text) for text in self.corpus)
            object.__setattr__(self, "corpus", texts)

    def tokens_for(self, match: int) -> int:
        """Tokens proposed for a suffix match of ``match`` tokens."""
        return self.tokens_by_match[min(match, len(self.tokens_by_match) - 1)]

    @property
    def max_tokens(self) -> int:
        """The longest branch any match proposes."""
        return max(self.tokens_for(n) for n in range(self.min_ngram, self.max_ngram + 1))

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> PromptLookup:
        """Settings from a calibration record (``{"tokens_by_match": [...], ...}``); None: the defaults."""
        if not record:
            return cls()
        known = {k: v for k, v in record.items() if k in cls.__dataclass_fields__}
        if "tokens_by_match" in known:
            known["tokens_by_match"] = tuple(known["tokens_by_match"])
        return cls(**known)

    def record(self) -> dict[str, Any]:
        return {
            "max_ngram": self.max_ngram,
            "min_ngram": self.min_ngram,
            "candidates": self.candidates,
            "tokens_by_match": list(self.tokens_by_match),
            "skip_drafter_at": self.skip_drafter_at,
        }


def lookup_settings(value: bool | PromptLookup | dict[str, Any] | None) -> PromptLookup | None:
    """The ``prompt_lookup=`` argument of the API: False/None (off), True (defaults), settings or a record."""
    if value is None or value is False:
        return None
    if value is True:
        return PromptLookup()
    if isinstance(value, PromptLookup):
        return value
    if isinstance(value, dict):
        return PromptLookup.from_record(value)
    raise TypeError(f"prompt_lookup must be a bool, a PromptLookup or a dict, got {type(value).__name__}")


class SuffixIndex:
    """One row's context, indexed by its n-grams (``min_ngram`` to ``max_ngram`` tokens) as tokens are committed.

    :meth:`lookup` finds the longest suffix of the context that occurred earlier and returns the continuations of
    its occurrences, most recent first, then those of shorter matches, in time independent of the context's length.
    """

    def __init__(self, settings: PromptLookup) -> None:
        self.settings = settings
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> the positions just after its occurrences
        self.indexed = 0

    def _index(self, context: Sequence[int]) -> None:
        low, high = self.settings.min_ngram, self.settings.max_ngram
        for end in range(max(self.indexed, 1), len(context) + 1):
            for size in range(low, min(high, end) + 1):
                self.ends.setdefault(tuple(context[end - size : end]), []).append(end)
        self.indexed = len(context)

    def lookup(self, context: Sequence[int], limit: int) -> list[tuple[int, list[int]]]:
        """Up to ``candidates`` distinct ``(match length, continuation)`` pairs, each at most ``limit`` tokens."""
        self._index(context)
        total, found, seen = len(context), [], set()
        for size in range(min(self.settings.max_ngram, total - 1), self.settings.min_ngram - 1, -1):
            length = min(self.settings.tokens_for(size), limit)
            if length < 1:
                continue
            for end in reversed(self.ends.get(tuple(context[total - size :]), ())):
                if end >= total:
                    continue  # the suffix itself
                continuation = list(context[end : min(end + length, total)])
                key = tuple(continuation)
                if continuation and key not in seen:
                    seen.add(key)
                    found.append((size, continuation))
                    if len(found) >= self.settings.candidates:
                        return found
        return found

    def match_length(self, context: Sequence[int]) -> int:
        """The longest suffix match (0: none), after indexing ``context``."""
        found = self.lookup(context, max(1, self.settings.max_tokens))
        return found[0][0] if found else 0


# Of a corpus match with more occurrences than this, an evenly spaced sample of this many votes on the continuation.
CORPUS_SAMPLE = 64
_SEPARATOR = -1  # between the corpus's texts: no n-gram and no continuation crosses it
_ASSISTANT_ROLES = ("assistant", "gpt", "model", "chatgpt", "bing", "bard")


class CorpusIndex:
    """A fixed corpus of token sequences (earlier outputs), indexed once; :meth:`lookup` as :class:`SuffixIndex`'s.

    The texts are laid end to end with a separator between them; each position with a token before it and one at it
    (a continuation's start) is sorted by the tokens before it, nearest first (a suffix array of the reversed text,
    cut at ``max_ngram`` tokens). The occurrences of a context's last n tokens are then one range of that order,
    narrowed one token at a time: the nearest few tokens are packed into one integer key (a binary search in
    numpy), the farther ones are searched within the range. A lookup costs ``O(max_ngram log N)`` whatever the
    corpus's size; the index holds about 20 bytes per corpus token.

    Of a match's occurrences (an evenly spaced sample of :data:`CORPUS_SAMPLE` when it has more), the proposed
    continuation is their most frequent path: at each depth the token most of the occurrences still on the path
    continue with (ties: the smaller token id); a further candidate takes the occurrences whose first token differs.
    """

    def __init__(self, texts: Sequence[Sequence[int]], settings: PromptLookup) -> None:
        self.settings = settings
        flat = [_SEPARATOR] * settings.max_ngram  # a left margin: every end has max_ngram tokens before it
        for text in texts:
            flat.extend(text)
            flat.append(_SEPARATOR)
        flat.extend([_SEPARATOR] * max(settings.tokens_by_match))  # a right margin for the longest continuation
        stream = np.asarray(flat, dtype=np.int64)
        valid = stream >= 0
        self.tokens = int(valid.sum())
        if self.tokens != sum(len(text) for text in texts):
            raise ValueError("a lookup corpus holds token ids, which are non-negative")
        ends = np.flatnonzero(valid[:-1] & valid[1:]) + 1  # [E] a token before, a token from here on
        # The tokens before an end, nearest first, each shifted by one (the separator is 0), `packed` to an int64 key.
        self._bits = (int(stream.max()) + 2).bit_length()
        self._packed = min(settings.max_ngram, 63 // self._bits)
        keys = []
        for first in range(1, settings.max_ngram + 1, self._packed):
            key = np.zeros(len(ends), dtype=np.int64)
            for depth in range(first, min(first + self._packed, settings.max_ngram + 1)):
                key = (key << self._bits) | (stream[ends - depth] + 1)
            keys.append(key)
        order = np.lexsort(keys[::-1])  # the last key sorts first: the nearest tokens
        self._keys = keys[0][order]
        self._ends = ends[order]
        self._stream = stream.astype(np.int32)
        self._stream_view, self._ends_view = memoryview(self._stream), memoryview(self._ends)

    def _narrow(self, lo: int, hi: int, depth: int, token: int) -> tuple[int, int]:
        """The entries of ``[lo, hi)`` whose token ``depth`` places before their end is ``token`` (the range is
        sorted by that token: its entries share the ``depth - 1`` tokens after it)."""
        stream, ends = self._stream_view, self._ends_view
        first, last = lo, hi
        while first < last:
            middle = (first + last) // 2
            if stream[ends[middle] - depth] < token:
                first = middle + 1
            else:
                last = middle
        start, last = first, hi
        while first < last:
            middle = (first + last) // 2
            if stream[ends[middle] - depth] <= token:
                first = middle + 1
            else:
                last = middle
        return start, first

    def _ranges(self, context: Sequence[int]) -> list[tuple[int, int]]:
        """``ranges[n - 1]``: the entries that follow the context's last n tokens, for each n that occurs."""
        ranges: list[tuple[int, int]] = []
        lo, hi, prefix = 0, len(self._ends), 0
        for depth in range(1, min(self.settings.max_ngram, len(context)) + 1):
            token = int(context[-depth])
            if depth <= self._packed:
                if token + 1 >= 1 << self._bits:
                    break  # a token the corpus never holds
                prefix = (prefix << self._bits) | (token + 1)
                shift = self._bits * (self._packed - depth)
                lo, hi = np.searchsorted(self._keys, [prefix << shift, (prefix + 1) << shift]).tolist()
            else:
                lo, hi = self._narrow(lo, hi, depth, token)
            if lo == hi:
                break
            ranges.append((lo, hi))
        return ranges

    def lookup(self, context: Sequence[int], limit: int) -> list[tuple[int, list[int]]]:
        """Up to ``candidates`` distinct ``(match length, continuation)`` pairs, longest match first, each at most
        ``limit`` tokens."""
        settings = self.settings
        ranges = self._ranges(context)
        found, seen = [], set()
        for size in range(len(ranges), settings.min_ngram - 1, -1):
            length = min(settings.tokens_for(size), limit)
            if length < 1:
                continue
            for continuation in self._continuations(*ranges[size - 1], length):
                if tuple(continuation) not in seen:
                    seen.add(tuple(continuation))
                    found.append((size, continuation))
                    if len(found) >= settings.candidates:
                        return found
        return found

    def _continuations(self, lo: int, hi: int, length: int) -> list[list[int]]:
        """The most frequent paths (see the class) of the ``length`` tokens after the occurrences ``[lo, hi)``."""
        if hi - lo <= CORPUS_SAMPLE:
            picks = np.arange(lo, hi)
        else:
            picks = lo + np.arange(CORPUS_SAMPLE) * (hi - lo) // CORPUS_SAMPLE
        rows = self._stream[self._ends[picks][:, None] + np.arange(length)].tolist()  # [K, length]
        paths: list[list[int]] = []
        while rows and len(paths) < self.settings.candidates:
            path, following = [], rows
            for depth in range(length):
                if len(following) == 1:  # one occurrence left: its own continuation, up to its text's end
                    rest = following[0][depth:]
                    path.extend(rest[: rest.index(_SEPARATOR)] if _SEPARATOR in rest else rest)
                    break
                counts = Counter(row[depth] for row in following if row[depth] != _SEPARATOR)
                if not counts:
                    break
                path.append(min(counts, key=lambda token: (-counts[token], token)))
                following = [row for row in following if row[depth] == path[-1]]  # a text that ended leaves
            paths.append(path)
            rows = [row for row in rows if row[0] != path[0]]
        return paths


def output_texts(record: dict[str, Any]) -> list[str]:
    """The outputs one corpus record holds: its ``response``, else its assistant turns (``conversations`` or
    ``messages``, ShareGPT's ``from``/``value`` or ``role``/``content``), else its ``text``."""
    if isinstance(record.get("response"), str):
        return [record["response"]]
    for key in ("conversations", "messages"):
        turns = record.get(key)
        if isinstance(turns, list):
            outputs = []
            for turn in turns:
                if not isinstance(turn, dict):
                    continue
                role = str(turn.get("from", turn.get("role"))).strip().lower()
                content = turn.get("value", turn.get("content"))
                if role in _ASSISTANT_ROLES and isinstance(content, str):
                    outputs.append(content)
            return outputs
    return [record["text"]] if isinstance(record.get("text"), str) else []


def read_corpus(path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None) -> list[list[int]]:
    """The token ids of a lookup corpus: a JSONL file whose lines are token-id lists, records with ``token_ids``
    (or ``input_ids``), or records with texts (:func:`output_texts`: ``response``, assistant turns, ``text``); the
    texts are tokenised together, once, without special tokens.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not JSON or holds no output; texts without a tokenizer; no tokens at all.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lookup corpus {path} does not exist")
    ids: list[list[int]] = []
    texts: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from error
            tokens = record.get("token_ids", record.get("input_ids")) if isinstance(record, dict) else record
            if isinstance(tokens, list):
                ids.append([int(token) for token in tokens])
                continue
            outputs = output_texts(record) if isinstance(record, dict) else []
            if not outputs:
                raise ValueError(
                    f"{path}:{number}: no output: a line is a token-id list or a record with 'token_ids', "
                    "'response', assistant turns ('conversations'/'messages') or 'text'"
                )
            texts.extend(text for text in outputs if text.strip())
    if texts:
        if tokenizer is None:
            raise ValueError(f"lookup corpus {path} holds texts: tokenising them needs the base's tokenizer")
        ids.extend(tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"])
    if not any(ids):
        raise ValueError(f"lookup corpus {path} holds no tokens")
    return ids


def combined_matches(
    own: Sequence[tuple[int, list[int]]], corpus: Sequence[tuple[int, list[int]]], candidates: int
) -> list[tuple[int, list[int]]]:
    """Up to ``candidates`` distinct ``(match length, continuation)`` pairs of a row's own index and of the corpus
    (each longest first): the longer match first; at equal length the row's own first."""
    found, seen = [], set()
    for size, continuation in sorted([*own, *corpus], key=lambda pair: -pair[0]):  # stable: own before corpus
        if tuple(continuation) not in seen:
            seen.add(tuple(continuation))
            found.append((size, continuation))
    return found[:candidates]


def corpus_index(settings: PromptLookup, tokenizer: PreTrainedTokenizerBase | None = None) -> CorpusIndex | None:
    """The index of ``settings.corpus`` (a file is read with :func:`read_corpus`); None without a corpus."""
    if settings.corpus is None:
        return None
    texts = settings.corpus
    if isinstance(texts, (str, Path)):
        texts = read_corpus(texts, tokenizer)
    return CorpusIndex(texts, settings)


@dataclass
class LookupStats:
    """What the lookup proposed and what the base accepted of it, by match length (for calibration).

    ``proposed[n]`` / ``accepted[n]``: lookup tokens proposed at match length n, and those accepted (tokens on the
    accepted path that only the lookup drafted); ``agreement[n][d]``: for a branch of match length n, how often its
    d-th token was accepted, against how often it was proposed (``offered[n][d]``).
    """

    proposed: dict[int, int] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)
    offered: dict[int, list[int]] = field(default_factory=dict)
    taken: dict[int, list[int]] = field(default_factory=dict)
    skipped_drafts: int = 0

    def record(self, match: int, branch: Sequence[int], accepted: Sequence[int]) -> None:
        """A branch of ``match`` length was proposed; ``accepted`` are the tokens the base accepted this step."""
        common = 0
        for drafted, taken in zip(branch, accepted, strict=False):
            if drafted != taken:
                break
            common += 1
        offered = self.offered.setdefault(match, [])
        taken_list = self.taken.setdefault(match, [])
        while len(offered) < len(branch):
            offered.append(0)
            taken_list.append(0)
        for depth in range(len(branch)):
            offered[depth] += 1
            taken_list[depth] += int(depth < common)
        self.proposed[match] = self.proposed.get(match, 0) + len(branch)
        self.accepted[match] = self.accepted.get(match, 0) + common


@dataclass
class _Composed:
    """A composed generation's state: the drafter's own (``inner``), each row's index, the step's bookkeeping."""

    inner: Any
    indexes: list[SuffixIndex]
    inner_trees: list[tuple[tuple[int, ...], list[int]] | None]  # per row: the drafter's parents and tokens
    branches: list[list[tuple[int, list[int]]]]  # per row: the lookup's (match length, branch) of the step
    lengths: list[int]  # per row: committed tokens when the step was proposed
    stats: LookupStats


class WithLookup(Drafter):
    """``inner`` with prompt lookup as a second source in the same tree (see the module).

    Args:
        inner: any drafter (``NoDrafter`` makes lookup the only source).
        settings: the lookup's settings (:class:`PromptLookup`).
        tokenizer: tokenises a corpus file's texts (``settings.corpus``), once, here.

    Attributes:
        last_stats: the lookup's :class:`LookupStats` of the latest generation (of a batched generate's latest
            chunk), counted as it decodes; ``calibrate --prompt-lookup`` reads it.
    """

    def __init__(
        self,
        inner: Drafter,
        settings: PromptLookup | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        if isinstance(inner, WithLookup):
            raise ValueError("the drafter already has prompt lookup composed with it")
        self.inner = inner
        self.settings = settings or PromptLookup()
        self.corpus = corpus_index(self.settings, tokenizer)  # one index for every generation of this decoder
        self.name = f"{inner.name}+lookup"
        self.hidden_state_layers = inner.hidden_state_layers
        self.last_stats = LookupStats()

    def __getattr__(self, name: str) -> Any:
        # The wrapped drafter's own attributes (``head``, ``model``, calibration records) read through.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def check_request(self, request: DraftRequest) -> None:
        self.inner.check_request(request)

    def resolve(self, tree: Any) -> Any:
        return self.inner.resolve(tree)

    def extra_nodes(self, request: DraftRequest) -> int:
        return self.inner.extra_nodes(request) + self.settings.candidates * self.settings.max_tokens

    def max_nodes(self, request: DraftRequest) -> int:
        return self.inner.max_nodes(request) + self.settings.candidates * self.settings.max_tokens

    def gives_draft_probs(self, request: DraftRequest) -> bool:
        return self.inner.gives_draft_probs(request)

    @contextmanager
    def _inner_view(self, state: DecodeState) -> Iterator[_Composed]:
        """``state.draft`` as the wrapped drafter knows it, for the duration of one of its calls."""
        composed: _Composed = state.draft
        state.draft = composed.inner
        try:
            yield composed
        finally:
            composed.inner = state.draft
            state.draft = composed

    def reset(self, state: DecodeState) -> None:
        self.inner.reset(state)
        rows = len(state.rows)
        state.draft = _Composed(
            state.draft,
            [SuffixIndex(self.settings) for _ in range(rows)],
            [None] * rows,
            [[] for _ in range(rows)],
            [0] * rows,
            LookupStats(),
        )
        self.last_stats = state.draft.stats

    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | list[Proposal | None] | None:
        """Each row's drafter proposal with its lookup branches grafted on (:func:`merge`). Where no row gains a
        lookup node, the drafter's own answer is returned as it gave it (one tree for all rows stays one), so an
        idle lookup leaves the verify forward as it was."""
        composed: _Composed = state.draft
        rows = state.rows
        limits = request.max_depths or (request.max_depth,) * len(rows)
        branches = []
        for i, row in enumerate(rows):
            context = state.host_tokens[row] if state.host_tokens else state.sequence(row).tolist()
            branches.append(self._lookup(composed.indexes[i], context, limits[i]) if limits[i] > 0 else [])
        skip = self.settings.skip_drafter_at is not None and all(
            found and found[0][0] >= self.settings.skip_drafter_at for found in branches
        )
        raw: Proposal | list[Proposal | None] | None = None
        if skip:
            inner: list[Proposal | None] = [None] * len(rows)
            composed.stats.skipped_drafts += 1
        else:
            with self._inner_view(state):
                raw = self.inner.propose(state, request)
            inner = rows_of(raw, len(rows))
        composed.branches = branches
        composed.lengths = [state.lengths[row] for row in rows]
        proposals: list[Proposal | None] = []
        device = state.tokens.device
        grafted = False  # whether some row gained a lookup node
        for i, (proposal, found) in enumerate(zip(inner, branches, strict=True)):
            if proposal is None or proposal.tokens.shape[1] == 0:
                composed.inner_trees[i] = None
                proposal = None
            else:
                composed.inner_trees[i] = (proposal.tree.parents, proposal.tokens[0].tolist())
            proposals.append(merge(proposal, [branch for _, branch in found], device))
            grafted = grafted or proposals[-1] is not proposal
        return proposals if grafted or skip else raw

    def _lookup(self, index: SuffixIndex, context: Sequence[int], limit: int) -> list[tuple[int, list[int]]]:
        found = index.lookup(context, limit)
        if self.corpus is None:
            return found
        return combined_matches(found, self.corpus.lookup(context, limit), self.settings.candidates)

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        composed: _Composed = state.draft
        inner_counts = []
        for i, (row, count) in enumerate(zip(state.rows, num_accepted, strict=True)):
            start = composed.lengths[i]
            taken = state.host_tokens[row][start : start + count] if state.host_tokens else []
            if not state.host_tokens:
                taken = state.tokens[row, start : start + count].tolist()
            for match, branch in composed.branches[i]:
                composed.stats.record(match, branch, taken)
            tree = composed.inner_trees[i]
            inner_counts.append(0 if tree is None else path_on_tree(tree[0], tree[1], taken))
        with self._inner_view(state):
            self.inner.accepted(state, inner_counts)

    def keep_rows(self, state: DecodeState, keep: list[int]) -> None:
        composed: _Composed = state.draft
        composed.indexes = [composed.indexes[i] for i in keep]
        composed.inner_trees = [composed.inner_trees[i] for i in keep]
        composed.branches = [composed.branches[i] for i in keep]
        composed.lengths = [composed.lengths[i] for i in keep]
        with self._inner_view(state):
            self.inner.keep_rows(state, keep)


def path_on_tree(parents: Sequence[int], tokens: Sequence[int], taken: Sequence[int]) -> int:
    """How many of ``taken`` (the accepted tokens, in order) follow one root path of the tree (``parents`` of nodes
    0..N, node i's token ``tokens[i - 1]``)."""
    children: dict[int, list[int]] = {}
    for node in range(1, len(parents)):
        children.setdefault(parents[node], []).append(node)
    node, count = 0, 0
    for token in taken:
        nxt = next((c for c in children.get(node, ()) if tokens[c - 1] == token), None)
        if nxt is None:
            break
        node, count = nxt, count + 1
    return count


def merge(proposal: Proposal | None, branches: Sequence[Sequence[int]], device: torch.device) -> Proposal | None:
    """One row's drafter proposal (``[1, N]``, or None) with lookup ``branches`` grafted at its root.

    A branch follows the drafter's nodes while their tokens agree and adds nodes from there. Nodes are listed by
    depth (the drafter's first at each depth, in their order), as the engine's per-row truncation expects; a lookup
    node's draft probability is one-hot. Without a new node the drafter's proposal is returned as it was.
    """
    if proposal is None:
        parents: list[int] = [-1]
        tokens: list[int] = []
    else:
        parents = list(proposal.tree.parents)
        tokens = proposal.tokens[0].tolist()
    inner_count = len(tokens)
    child: dict[tuple[int, int], int] = {}
    for node in range(1, len(parents)):
        child.setdefault((parents[node], tokens[node - 1]), node)
    for branch in branches:
        node = 0
        for token in branch:
            nxt = child.get((node, token))
            if nxt is None:
                parents.append(node)
                tokens.append(int(token))
                nxt = len(parents) - 1
                child[(node, token)] = nxt
            node = nxt
    if len(tokens) == inner_count:
        return proposal
    depths = [0] * len(parents)
    for node in range(1, len(parents)):
        depths[node] = depths[parents[node]] + 1
    order = sorted(range(1, len(parents)), key=lambda n: (depths[n], n))
    new_index = {old: new for new, old in enumerate(order, 1)}
    new_index[0] = 0
    new_parents = [-1] + [new_index[parents[old]] for old in order]
    new_tokens = [tokens[old - 1] for old in order]
    tree: TreeBuffers = tree_from_parents(new_parents)
    token_tensor = kv_cache.to_device([new_tokens], device)
    probs = None
    if proposal is not None and proposal.draft_probs is not None:
        inner_probs = proposal.draft_probs[0]
        vocab = inner_probs.shape[-1]
        rows = []
        for old in order:
            if old <= inner_count:
                rows.append(inner_probs[old - 1])
            else:
                rows.append(torch.nn.functional.one_hot(torch.tensor(tokens[old - 1]), vocab).to(inner_probs))
        probs = torch.stack(rows)[None]
    return Proposal(token_tensor, tree, probs)
