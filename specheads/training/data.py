"""Training data: files of text, JSONL or ShareGPT conversations -> fixed-length rows of token ids and masks.

Every row has ``input_ids``, ``attention_mask`` and ``loss_mask``, each a list of ``config.max_length`` ints (stored
as int32 ids and int8 masks). ``loss_mask[t] == 1`` means token ``t`` is a training target (the trainer shifts: it is
predicted from tokens ``< t``).

Files (``config.paths``, files or folders). A folder means the files below it, recursively, sorted by their path
relative to the folder, skipping hidden files and folders (names starting with "."). Which files count:

- ``text``: every file that decodes as UTF-8 (others are skipped with a warning; a file named directly must decode).
  Each file is one document.
- ``jsonl``: ``*.jsonl`` files. One JSON object per line; ``config.text_field`` holds the document. Blank lines are
  skipped.
- ``sharegpt``: ``*.json`` and ``*.jsonl`` files. A file whose first non-blank character is ``[`` is one JSON list of
  records, otherwise JSONL. A record holds ``"conversations"`` (or ``"messages"``): a list of turns
  ``{"from": "human"|"gpt"|"system", "value": str}`` or ``{"role": "user"|"assistant"|"system", "content": str}``.

Layout. ``text``/``jsonl`` documents are tokenised with the tokenizer's own special tokens (a BOS where it adds one)
and followed by EOS. With ``config.packing`` the documents are concatenated into one stream (EOS between documents)
and cut into consecutive ``max_length`` windows, the short tail dropped; every token is attended to and a target.
Otherwise (and always for ``sharegpt``) each record is one row, truncated to ``max_length`` and right-padded with the
pad id (the pad token, else EOS, else 0); padding has ``attention_mask`` and ``loss_mask`` 0.

Conversations are rendered with the chat template (``config.chat_template`` -- a template string or a file holding
one -- else the tokenizer's) and tokenised without extra special tokens (the template writes them). Only assistant
tokens are targets: for each assistant turn, the conversation rendered up to it with the generation prompt must be a
prefix of the conversation rendered with it, which must be a prefix of the whole rendering (else the template is not
prefix-stable and a ``DataError`` says so). The target span is the turn's content plus the template's end-of-turn
marker (e.g. ``Hi.<|im_end|>`` in ChatML), without the whitespace the template writes after the marker and without a
role header the template writes before the content when it has no generation prompt. A token is a target when its
characters overlap a target span. Rows whose targets were all truncated away are dropped.

``config.limit`` keeps the first N records read (before the held-out split). ``config.heldout_fraction`` sends each
record to the held-out split when the first 8 bytes of sha256 of its text (documents) or of its canonical JSON
(conversations), read as a fraction of 2**64, fall below the fraction: deterministic and independent of file order.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasets
from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from specheads.loading import pad_token_id
from specheads.training.config import DataConfig

logger = logging.getLogger(__name__)

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
_FOLDER_SUFFIXES = {"jsonl": (".jsonl",), "sharegpt": (".json", ".jsonl")}
_SENTINEL = "SpecheadsSentinel7f3a"  # stands in for an assistant message to find the template's header and end marker
_COLUMNS = ["input_ids", "attention_mask", "loss_mask"]
# Compact storage (ids < 2**31, masks 0/1); the trainer reads them with with_format("torch") and the train steps
# cast ids to int64 where torch needs them.
_FEATURES = datasets.Features(
    {
        "input_ids": datasets.List(datasets.Value("int32")),
        "attention_mask": datasets.List(datasets.Value("int8")),
        "loss_mask": datasets.List(datasets.Value("int8")),
    }
)
Renderer = Callable[[list[dict[str, str]], bool], str]


class DataError(ValueError):
    """Training data that cannot be used: a missing path, a malformed record, an unusable chat template."""


def build_dataset(config: DataConfig, tokenizer: PreTrainedTokenizerBase, split: str = "train") -> datasets.Dataset:
    """Read, split, tokenise and lay out the training data.

    Args:
        config: the recipe's ``data`` section.
        tokenizer: the base model's tokenizer.
        split: ``"train"`` (records outside the held-out fraction) or ``"heldout"`` (those inside it).

    Returns:
        Rows with ``input_ids``, ``attention_mask`` (1 on real tokens, 0 on padding) and ``loss_mask`` (1 where the
        token is a training target), each a list of ``config.max_length`` ints.

    Raises:
        DataError: a missing path, no records, a malformed record (the message names file and line), a tokenizer
            without a chat template for ``sharegpt``, a template that is not prefix-stable, or an empty split.
    """
    _check_arguments(config, tokenizer, split)
    render = _chat_renderer(config, tokenizer) if config.format == "sharegpt" else None
    records = list(_read_records(_resolve_files(config.paths, config.format), config))
    if not records:
        raise DataError(f"no records found in {config.paths}")
    records = [r for r in records if _in_heldout(r["key"], config.heldout_fraction) == (split == "heldout")]
    if not records:
        raise DataError(f"no records fall in the {split} split (heldout_fraction={config.heldout_fraction})")
    rows = _layout(datasets.Dataset.from_list(records), config, tokenizer, render)
    if len(rows) == 0:
        raise DataError(
            f"the {split} split yields no rows: with packing, the data holds fewer than max_length={config.max_length} "
            "tokens; for conversations, every assistant turn was truncated away"
        )
    return rows


def _check_arguments(config: DataConfig, tokenizer: PreTrainedTokenizerBase, split: str) -> None:
    if config.format not in ("text", "jsonl", "sharegpt"):
        raise DataError(f"data.format is {config.format!r}; choose one of ['jsonl', 'sharegpt', 'text']")
    if split not in ("train", "heldout"):
        raise DataError(f"split is {split!r}; choose 'train' or 'heldout'")
    if not 0.0 <= config.heldout_fraction < 1.0:
        raise DataError(f"data.heldout_fraction must be in [0, 1), got {config.heldout_fraction}")
    if split == "heldout" and config.heldout_fraction == 0.0:
        raise DataError("the heldout split is empty: data.heldout_fraction is 0")
    if config.max_length <= 0:
        raise DataError(f"data.max_length must be > 0, got {config.max_length}")
    if config.format != "sharegpt" and config.packing and tokenizer.eos_token_id is None:
        raise DataError("packing joins documents with EOS, but the tokenizer has no EOS token; set packing false")


def _layout(
    table: datasets.Dataset, config: DataConfig, tokenizer: PreTrainedTokenizerBase, render: Renderer | None
) -> datasets.Dataset:
    """Tokenise the records of ``table`` into rows of ``_FEATURES``: packed windows or one padded row per record."""
    common = dict(batched=True, remove_columns=table.column_names)
    if render is not None:
        return table.map(
            lambda batch: _conversation_rows(batch, render, tokenizer, config.max_length),
            features=_FEATURES,
            desc="tokenising conversations",
            **common,
        )
    if not config.packing:
        return table.map(
            lambda batch: _padded_document_rows(batch["text"], tokenizer, config.max_length),
            features=_FEATURES,
            desc="tokenising documents",
            **common,
        )
    tokenized = table.map(
        lambda batch: {"ids": _document_ids(batch["text"], tokenizer)}, desc="tokenising documents", **common
    )
    # One batch over the whole table, so windows run across documents and only the final tail is dropped.
    return tokenized.map(
        lambda batch: _pack(batch["ids"], config.max_length),
        batched=True,
        batch_size=None,
        remove_columns=["ids"],
        features=_FEATURES,
        desc="packing windows",
    )


# ---------------------------------------------------------------------------------------------------------- reading


def _resolve_files(paths: list[str], data_format: str) -> list[Path]:
    """The files named by ``paths``, folders expanded (see the module docstring for which files count)."""
    if not paths:
        raise DataError("data.paths is empty: name at least one data file or folder")
    files: list[Path] = []
    for name in paths:
        path = Path(name).expanduser()
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            found = _folder_files(path, data_format)
            if not found:
                kinds = "UTF-8 text" if data_format == "text" else " or ".join(_FOLDER_SUFFIXES[data_format])
                raise DataError(f"data folder {path} holds no {kinds} files")
            files.extend(found)
        else:
            raise DataError(f"data path {path} does not exist")
    return files


def _folder_files(folder: Path, data_format: str) -> list[Path]:
    candidates = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.relative_to(folder).as_posix())
    candidates = [p for p in candidates if not any(part.startswith(".") for part in p.relative_to(folder).parts)]
    if data_format != "text":
        return [p for p in candidates if p.name.endswith(_FOLDER_SUFFIXES[data_format])]
    files = []
    for path in candidates:
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            logger.warning("skipping %s: not UTF-8 text", path)
            continue
        files.append(path)
    return files


def _read_records(files: list[Path], config: DataConfig) -> Iterator[dict[str, str]]:
    """Records ``{"text" | "messages", "key", "source"}`` in file order, at most ``config.limit`` of them."""
    count = 0
    for path in files:
        if config.format == "text":
            records = _read_text(path)
        elif config.format == "jsonl":
            records = _read_jsonl(path, config.text_field)
        else:
            records = _read_sharegpt(path)
        for record in records:
            if config.limit is not None and count >= config.limit:
                return
            count += 1
            yield record


def _read_text(path: Path) -> Iterator[dict[str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from error
    if text.strip():
        yield {"text": text, "key": text, "source": str(path)}


def _json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, object)`` for each non-blank line of a JSONL file; ``where`` is ``file:line``."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from error


def _read_jsonl(path: Path, text_field: str) -> Iterator[dict[str, str]]:
    for where, record in _json_lines(path):
        if not isinstance(record, dict):
            raise DataError(f"{where}: each line must be a JSON object, got {type(record).__name__}")
        if text_field not in record:
            raise DataError(f"{where}: no {text_field!r} field (data.text_field); fields: {sorted(record)}")
        text = record[text_field]
        if not isinstance(text, str):
            raise DataError(f"{where}: field {text_field!r} must be a string, got {type(text).__name__}")
        if text.strip():
            yield {"text": text, "key": text, "source": where}


def _read_sharegpt(path: Path) -> Iterator[dict[str, str]]:
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from error
    if content.lstrip().startswith("["):
        try:
            items = json.loads(content)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from error
        located = ((f"{path}: record {index}", item) for index, item in enumerate(items))
    else:
        located = _json_lines(path)
    for where, item in located:
        messages = _parse_conversation(item, where)
        key = json.dumps(messages, sort_keys=True, ensure_ascii=False)
        yield {"messages": json.dumps(messages, ensure_ascii=False), "key": key, "source": where}


def _parse_conversation(record: Any, where: str) -> list[dict[str, str]]:
    """``[{"role", "content"}]`` from a ShareGPT record, or a DataError naming ``where``."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: a record must be a JSON object with 'conversations', got {type(record).__name__}")
    turns = record.get("conversations", record.get("messages"))
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: no 'conversations' (or 'messages') list of turns; fields: {sorted(record)}")
    messages = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(f"{where}: turn {index} must be an object, got {type(turn).__name__}")
        speaker = turn.get("from", turn.get("role"))
        role = _ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise DataError(f"{where}: turn {index} has role {speaker!r}; use one of {sorted(_ROLES)}")
        content = turn.get("value", turn.get("content"))
        if not isinstance(content, str):
            raise DataError(f"{where}: turn {index} needs a string 'value' (or 'content'), got {content!r}")
        messages.append({"role": role, "content": content})
    return messages


def _in_heldout(key: str, fraction: float) -> bool:
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


# --------------------------------------------------------------------------------------------------------- documents


def _document_ids(texts: list[str], tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """Token ids of each document followed by EOS (when the tokenizer has one and did not add it already)."""
    eos = tokenizer.eos_token_id
    # Documents longer than the model's window are expected: packing or truncation cuts them to max_length later, so
    # the tokenizer's "longer than the specified maximum sequence length" warning is noise here (verbose=False).
    encoded = tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]
    return [ids + [eos] if eos is not None and (not ids or ids[-1] != eos) else ids for ids in encoded]


def _pack(documents: list[list[int]], max_length: int) -> dict[str, list[list[int]]]:
    stream = [token for ids in documents for token in ids]
    windows = [stream[start : start + max_length] for start in range(0, len(stream) - max_length + 1, max_length)]
    ones = [1] * max_length
    return {"input_ids": windows, "attention_mask": [ones] * len(windows), "loss_mask": [ones] * len(windows)}


def _pad_id_of(tokenizer: PreTrainedTokenizerBase) -> int:
    pad = pad_token_id(tokenizer=tokenizer)
    return 0 if pad is None else pad  # padded positions carry no loss: any id will do


def _padded_row(ids: list[int], targets: list[int], max_length: int, pad_id: int) -> dict[str, list[int]]:
    ids, targets = ids[:max_length], targets[:max_length]
    padding = max_length - len(ids)
    return {
        "input_ids": ids + [pad_id] * padding,
        "attention_mask": [1] * len(ids) + [0] * padding,
        "loss_mask": targets + [0] * padding,
    }


def _padded_document_rows(
    texts: list[str], tokenizer: PreTrainedTokenizerBase, max_length: int
) -> dict[str, list[list[int]]]:
    pad_id = _pad_id_of(tokenizer)
    rows = [_padded_row(ids, [1] * len(ids), max_length, pad_id) for ids in _document_ids(texts, tokenizer)]
    return {column: [row[column] for row in rows] for column in _COLUMNS}


# ----------------------------------------------------------------------------------------------------- conversations


def _chat_renderer(config: DataConfig, tokenizer: PreTrainedTokenizerBase) -> Renderer:
    """``render(messages, add_generation_prompt) -> str`` with the configured or the tokenizer's template."""
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

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    return render


def _conversation_rows(
    batch: dict[str, list[str]], render: Renderer, tokenizer: PreTrainedTokenizerBase, max_length: int
) -> dict[str, list[list[int]]]:
    pad_id = _pad_id_of(tokenizer)
    rows = []
    for messages_json, where in zip(batch["messages"], batch["source"], strict=True):
        messages = json.loads(messages_json)
        try:
            text, spans = _assistant_spans(messages, render, where)
        except DataError:
            raise
        except (TemplateError, ValueError, TypeError) as error:  # raise_exception() in templates, bad fields, ...
            raise DataError(f"{where}: the chat template failed on this conversation: {error}") from error
        if not spans:
            logger.warning("%s: no assistant turn, skipped", where)
            continue
        ids, targets = _tokenize_with_targets(text, spans, tokenizer)
        if any(targets[:max_length]):
            rows.append(_padded_row(ids, targets, max_length, pad_id))
    return {column: [row[column] for row in rows] for column in _COLUMNS}


def _assistant_spans(messages: list[dict[str, str]], render: Renderer, where: str) -> tuple[str, list[tuple[int, int]]]:
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


def _tokenize_with_targets(
    text: str, spans: list[tuple[int, int]], tokenizer: PreTrainedTokenizerBase
) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` (no added special tokens: the template wrote them) and 1 where a token overlaps a span."""
    if getattr(tokenizer, "is_fast", False):
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        targets = [
            int(any(start < span_end and span_start < end for span_start, span_end in spans))
            for start, end in encoding["offset_mapping"]
        ]
        return encoding["input_ids"], targets
    # No offsets: tokenise the pieces between span boundaries separately.
    ids: list[int] = []
    targets: list[int] = []
    position = 0
    for span_start, span_end in [*spans, (len(text), len(text))]:
        for piece, is_target in ((text[position:span_start], 0), (text[span_start:span_end], 1)):
            if piece:
                piece_ids = tokenizer(piece, add_special_tokens=False, verbose=False)["input_ids"]
                ids += piece_ids
                targets += [is_target] * len(piece_ids)
        position = span_end
    return ids, targets
