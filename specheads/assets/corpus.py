"""The corpus of the embedded default model: the running interpreter's standard-library ``.py`` files.

Importing this module has no side effects. ``load_corpus()`` lists the files deterministically and splits them into
a training part and a held-out part by a hash of each file's relative path, so the split never depends on file order.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

HELDOUT_PERCENT = 5
SPLIT_RULE = (
    "held out iff int(sha256(relpath.encode('utf-8')).hexdigest(), 16) % 100 < 5, "
    "relpath = POSIX path relative to sysconfig.get_paths()['stdlib']"
)
PATH_RULE = (
    "all *.py files under sysconfig.get_paths()['stdlib'], excluding any path with a 'site-packages' component "
    "and files that are not valid UTF-8; sorted by relative POSIX path"
)


@dataclass(frozen=True)
class CorpusFile:
    """One corpus file: its path relative to the stdlib root, its text and the sha256 of its bytes."""

    relpath: str
    text: str
    sha256: str


@dataclass
class Corpus:
    """The train / held-out split of the stdlib corpus plus a hash that identifies it."""

    root: str
    train: list[CorpusFile] = field(default_factory=list)
    heldout: list[CorpusFile] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    corpus_hash: str = ""

    def counts(self) -> dict[str, int]:
        """Number of files in each part and of files skipped as not UTF-8."""
        return {"train": len(self.train), "heldout": len(self.heldout), "skipped_non_utf8": len(self.skipped)}

    def summary(self) -> dict[str, object]:
        """A JSON-serialisable description of the corpus for manifests."""
        return {
            "python_version": sys.version.split()[0],
            "stdlib_root": self.root,
            "path_rule": PATH_RULE,
            "split_rule": SPLIT_RULE,
            "files": self.counts(),
            "train_chars": sum(len(f.text) for f in self.train),
            "heldout_chars": sum(len(f.text) for f in self.heldout),
            "corpus_hash": self.corpus_hash,
        }


def stdlib_root() -> Path:
    """The standard-library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str) -> bool:
    """Whether a file (by relative POSIX path) belongs to the held-out split (~5% of files)."""
    return int(hashlib.sha256(relpath.encode("utf-8")).hexdigest(), 16) % 100 < HELDOUT_PERCENT


def list_relpaths(root: Path) -> list[str]:
    """Sorted relative POSIX paths of all ``.py`` files under ``root``, without site-packages."""
    relpaths = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if "site-packages" in rel.parts or not path.is_file():
            continue
        relpaths.append(rel.as_posix())
    return sorted(relpaths)


def load_corpus(root: Path | None = None) -> Corpus:
    """Read every corpus file, split it, and hash the whole corpus.

    Args:
        root: the stdlib directory; defaults to the running interpreter's.

    Returns:
        A ``Corpus`` whose ``train`` and ``heldout`` lists are sorted by relative path. The corpus hash is the sha256
        over ``relpath\\0file_sha256\\n`` for every kept file in sorted order.
    """
    root = root or stdlib_root()
    corpus = Corpus(root=str(root))
    digest = hashlib.sha256()
    for relpath in list_relpaths(root):
        data = (root / relpath).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            corpus.skipped.append(relpath)
            continue
        file_hash = hashlib.sha256(data).hexdigest()
        digest.update(f"{relpath}\0{file_hash}\n".encode())
        item = CorpusFile(relpath=relpath, text=text, sha256=file_hash)
        (corpus.heldout if is_heldout(relpath) else corpus.train).append(item)
    corpus.corpus_hash = digest.hexdigest()
    return corpus


def split_files(root: Path | None = None) -> tuple[list[CorpusFile], list[CorpusFile], str, dict[str, int]]:
    """Return ``(train_files, heldout_files, corpus_hash, counts)`` for the stdlib corpus."""
    corpus = load_corpus(root)
    return corpus.train, corpus.heldout, corpus.corpus_hash, corpus.counts()
