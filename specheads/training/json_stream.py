"""Records streamed from JSON files: JSONL lines, and ShareGPT files with their real-world defects counted.

:func:`read_jsonl` yields the documents of a JSONL file. :func:`sharegpt_records` yields the usable conversations of
a ShareGPT file: a JSON list is parsed record by record, a chunk of the file at a time (a 125 MB file is never held
whole; a file cut short yields its complete records), other files are read as JSONL; each record is normalised
(roles, empty, leading and repeated turns) or skipped, and what was skipped, fixed or cut is counted in a
:class:`Tally`, which logs it in one line. The rules are in :mod:`specheads.training.data`'s docstring.
:func:`read_sharegpt_conversations` is that reading for use outside the training data (e.g. prompt files).
"""

from __future__ import annotations

import codecs
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from specheads.training.errors import DataError

logger = logging.getLogger(__name__)

_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}
_CHUNK_BYTES = 1 << 20  # a JSON list is read this much at a time (more while one record is longer)
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
# What json's decoder has left at the error when the text ends inside a value: nothing, part of a literal, a number's
# sign, point or exponent, or part of a \uXXXX escape.
_CUT_SHORT = re.compile(r"(-|\.|[eE][+-]?|t(r(u)?)?|f(a(l(s)?)?)?|n(u(l)?)?|u[0-9a-fA-F]{0,4})?")


def read_sharegpt_conversations(
    path: str | Path, keep_system: bool = True
) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """``(id, messages)`` for each usable record of a ShareGPT file, normalised as :mod:`specheads.training.data` says.

    Args:
        path: a ShareGPT ``.json`` (list) or ``.jsonl`` file.
        keep_system: keep a first system turn (False: drop system turns, for templates that take none).

    Yields:
        The record's ``"id"`` (as a string; its location ``file: record N`` or ``file:line`` when it has none) and
        its ``[{"role", "content"}]`` messages. The counts per cause are logged once the file is read through.

    Raises:
        DataError: the file is not UTF-8, not JSON, or holds a record that is not an object.
    """
    tally = Tally()
    for where, record, messages in sharegpt_records(Path(path), tally, keep_system):
        record_id = record.get("id")
        tally.used += 1
        yield (where if record_id is None else str(record_id)), messages
    tally.log()


def _json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, object)`` for each non-blank line of a JSONL file; ``where`` is ``file:line``."""
    number = 0
    try:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from error
                yield where, item
    except UnicodeDecodeError as error:
        raise DataError(f"{path}:{number + 1}: not UTF-8 text ({error.reason})") from error


def read_jsonl(path: Path, text_field: str) -> Iterator[tuple[str, str]]:
    for where, record in _json_lines(path):
        if not isinstance(record, dict):
            raise DataError(f"{where}: each line must be a JSON object, got {type(record).__name__}")
        if text_field not in record:
            raise DataError(f"{where}: no {text_field!r} field (data.text_field); fields: {sorted(record)}")
        text = record[text_field]
        if not isinstance(text, str):
            raise DataError(f"{where}: field {text_field!r} must be a string, got {type(text).__name__}")
        if text.strip():
            yield where, text


# ----------------------------------------------------------------------------------------------------- ShareGPT reading


def sharegpt_records(
    path: Path, tally: Tally, keep_system: bool
) -> Iterator[tuple[str, dict[str, Any], list[dict[str, str]]]]:
    """``(where, record, messages)`` for each usable record of a ShareGPT file; the others are counted in ``tally``."""
    items = _json_array_items(path, tally) if _starts_with_bracket(path) else _json_lines(path)
    for where, record in items:
        if not isinstance(record, dict):
            raise DataError(
                f"{where}: a record must be a JSON object with 'conversations', got {type(record).__name__}"
            )
        tally.read += 1
        messages = _normalise_conversation(record, keep_system, tally)
        if messages is not None:
            yield where, record, messages


def _starts_with_bracket(path: Path) -> bool:
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 16):
            if stripped := chunk.lstrip():
                return stripped.startswith(b"[")
    return False


class _TextWindow:
    """The text of a UTF-8 file not parsed yet, read a chunk at a time: ``text[0]`` is byte ``start`` of the file."""

    def __init__(self, handle: BinaryIO, path: Path) -> None:
        self.text, self.start, self.line, self.eof = "", 0, 1, False
        self._handle, self._path, self._bytes_read = handle, path, 0
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def read_more(self, position: int) -> int:
        """Forget ``text[:position]``, read the next chunk (at least as long as the text kept) and return the new
        index of ``position`` (0)."""
        done = self.text[:position]
        self.start += len(done.encode("utf-8"))
        self.line += done.count("\n")
        data = self._handle.read(max(_CHUNK_BYTES, len(self.text) - position))
        try:
            decoded = self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as error:
            place = self._bytes_read + error.start
            raise DataError(f"{self._path}: not UTF-8 text ({error.reason} near byte {place})") from error
        self._bytes_read += len(data)
        self.eof = not data
        self.text = self.text[position:] + decoded
        return 0

    def skip_whitespace(self, position: int) -> int:
        """The index of the next non-whitespace character, reading on as needed (``len(text)`` at the end)."""
        while True:
            position = _WHITESPACE.match(self.text, position).end()
            if position < len(self.text) or self.eof:
                return position
            position = self.read_more(position)

    def where(self, position: int) -> str:
        """``file:line`` of ``text[position]``."""
        line = self.line + self.text.count("\n", 0, position)
        return f"{self._path}:{line}"


def _json_array_items(path: Path, tally: Tally) -> Iterator[tuple[str, Any]]:
    """``(where, item)`` for each complete item of the JSON list in ``path`` (``where`` is ``file: record N``).

    The list is parsed item by item with ``raw_decode``, so a file cut short yields the items before the cut; the
    cut is warned about once and noted in ``tally``.
    """
    decode = json.JSONDecoder().raw_decode
    with path.open("rb") as handle:
        window = _TextWindow(handle, path)
        position = window.skip_whitespace(0) + 1  # past the "[" (the caller checked it is there)
        index = 0
        position = window.skip_whitespace(position)
        if window.text[position : position + 1] == "]":
            _check_array_end(window, position, path)
            return
        while True:
            if position == len(window.text):  # the file ends after "[" or ","
                tally.cut(path, window, position, index)
                return
            try:
                item, end = decode(window.text, position)
            except json.JSONDecodeError as error:
                if not _cut_short(error):
                    raise DataError(f"{window.where(error.pos)}: not valid JSON ({error.msg})") from error
                if window.eof:
                    tally.cut(path, window, position, index)
                    return
                position = window.read_more(position)
                continue
            if end == len(window.text) and not window.eof:  # a number may go on in the next chunk: read it whole
                position = window.read_more(position)
                continue
            yield f"{path}: record {index}", item
            index += 1
            position = window.skip_whitespace(end)
            if position == len(window.text):  # the file ends after a complete item
                tally.cut(path, window, position, index)
                return
            if window.text[position] == "]":
                _check_array_end(window, position, path)
                return
            if window.text[position] != ",":
                raise DataError(f"{window.where(position)}: not valid JSON (expecting ',' or ']' after record {index})")
            position = window.skip_whitespace(position + 1)
            if window.text[position : position + 1] == "]":
                raise DataError(f"{window.where(position)}: not valid JSON (a ',' before the closing ']')")


def _cut_short(error: json.JSONDecodeError) -> bool:
    """Whether decoding failed because the text ended (more text could complete the value), not on bad JSON."""
    if error.msg.startswith("Unterminated string"):  # the string runs to the end of the text
        return True
    rest = error.doc[error.pos :] if len(error.doc) - error.pos <= 64 else "not the end"
    return _CUT_SHORT.fullmatch(rest.strip()) is not None


def _check_array_end(window: _TextWindow, position: int, path: Path) -> None:
    after = window.skip_whitespace(position + 1)
    if after < len(window.text):
        raise DataError(f"{window.where(after)}: not valid JSON (extra data after the list's closing ']')")


# ------------------------------------------------------------------------------------------------- ShareGPT normalising


@dataclass
class Tally:
    """What reading ShareGPT records found: records read, skipped per cause, turns fixed per kind, files cut short."""

    read: int = 0
    used: int = 0  # counted by the consumer of the records (a limit may leave usable records unused)
    skipped: Counter[str] = field(default_factory=Counter)
    fixed: Counter[str] = field(default_factory=Counter)
    unknown_roles: Counter[str] = field(default_factory=Counter)
    cuts: list[str] = field(default_factory=list)

    def skip(self, cause: str) -> None:
        self.skipped[cause] += 1

    def cut(self, path: Path, window: _TextWindow, position: int, complete: int) -> None:
        offset = window.start + len(window.text[:position].encode("utf-8"))
        logger.warning(
            "%s: the file ends inside its JSON list (truncated): the record starting at byte %d is incomplete and "
            "skipped; %d complete records read before it",
            path,
            offset,
            complete,
        )
        self.cuts.append(f"{path.name} cut at byte {offset}")

    def describe_skips(self) -> str:
        parts = []
        for cause, count in self.skipped.most_common():
            if cause == "with an unknown role":
                roles = ", ".join(f"{role} x{n}" for role, n in self.unknown_roles.most_common(5))
                cause = f"{cause} ({roles})"
            parts.append(f"{count} {cause}")
        return ", ".join(parts)

    def summary(self) -> str:
        text = f"sharegpt: {self.read} records read, {self.used} used"
        if self.skipped:
            text += f"; skipped: {self.describe_skips()}"
        if self.fixed:
            text += "; " + ", ".join(f"{count} {kind}" for kind, count in self.fixed.most_common())
        if self.cuts:
            text += "; " + ", ".join(self.cuts)
        return text

    def level(self) -> int:
        return logging.WARNING if self.skipped or self.fixed or self.cuts else logging.INFO

    def log(self) -> None:
        logger.log(self.level(), "%s", self.summary())


def _normalise_conversation(record: dict[str, Any], keep_system: bool, tally: Tally) -> list[dict[str, str]] | None:
    """The record's ``[{"role", "content"}]`` messages normalised, or None (its cause counted) when unusable."""
    turns = record.get("conversations", record.get("messages"))
    if not isinstance(turns, list):
        tally.skip("without a 'conversations' list")
        return None
    if not turns:
        tally.skip("empty")
        return None
    parsed = []
    for turn in turns:
        if not isinstance(turn, dict):
            tally.skip("with a turn that is not an object")
            return None
        speaker = turn.get("from", turn.get("role"))
        role = _ROLES.get(speaker.strip().lower()) if isinstance(speaker, str) else None
        if role is None:
            tally.unknown_roles[repr(speaker)] += 1
            tally.skip("with an unknown role")
            return None
        content = turn.get("value", turn.get("content"))
        if not isinstance(content, str):
            tally.skip("with a non-string content")
            return None
        parsed.append((role, content))
    fixed: Counter[str] = Counter()
    messages = _repair_turns(parsed, keep_system, fixed)
    if not any(message["role"] == "assistant" for message in messages):
        tally.skip("without an assistant turn")
        return None
    tally.fixed.update(fixed)
    return messages


def _repair_turns(turns: list[tuple[str, str]], keep_system: bool, fixed: Counter[str]) -> list[dict[str, str]]:
    """Drop empty turns, system turns that are not first (or that the template takes none of) and assistant turns
    before the first user turn; merge runs of one role (contents joined by a blank line). ``fixed`` counts each."""
    messages: list[dict[str, str]] = []
    seen_user = False
    for index, (role, content) in enumerate(turns):
        if not content.strip():
            fixed["empty turns dropped"] += 1
        elif role == "system" and not keep_system:
            fixed["system turns dropped (the chat template takes none)"] += 1
        elif role == "system" and index > 0:
            fixed["system turns dropped (not first)"] += 1
        elif role == "assistant" and not seen_user:
            fixed["leading assistant turns dropped"] += 1
        elif messages and messages[-1]["role"] == role:
            messages[-1]["content"] += "\n\n" + content
            fixed["same-role turns merged"] += 1
        else:
            messages.append({"role": role, "content": content})
            seen_user = seen_user or role == "user"
    return messages
