"""Cut benchmark prompts for the default models from the HELD-OUT stdlib files.

Each prompt is the end of a file's text up to and including a function's ``def`` line and docstring, so the natural
completion is the function body. Prompts are trimmed at line boundaries to at most ``--max-tokens`` tokens of the
default tokenizer, keeping the end of the context. Output: ``specheads/assets/default/prompts.jsonl`` with lines
``{"id": "<relpath>:<qualified function name>", "prompt": "..."}``. The selection is deterministic for a seed.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from specheads.assets import corpus as default_corpus  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "specheads" / "assets" / "default" / "prompts.jsonl"
TOKENIZER_CANDIDATES = (
    REPO_ROOT / "specheads" / "assets" / "default" / "base",
    Path("/work/specheads-runs/pretrain/tokenizer"),
)


@dataclass(frozen=True)
class Candidate:
    """A documented function: where its header+docstring starts and ends in the file."""

    qualname: str
    start_line: int  # 1-based first line of the decorators / def
    end_line: int  # 1-based line holding the end of the docstring
    end_col: int  # column just after the docstring's closing quotes


def documented_functions(source: str) -> list[Candidate]:
    """Functions (incl. methods) whose first statement is a docstring and that have a body after it."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[Candidate] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = child.body[0]
                has_doc = ast.get_docstring(child) is not None and isinstance(doc, ast.Expr)
                if has_doc and len(child.body) >= 2 and doc.end_lineno is not None:
                    start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    found.append(Candidate(prefix + child.name, start, doc.end_lineno, doc.end_col_offset or 0))
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def make_prompt(lines: list[str], cand: Candidate, tokenizer, max_tokens: int) -> str | None:  # noqa: ANN001
    """Context + header + docstring + newline, trimmed from the front to ``max_tokens``; None if even that is longer."""
    last = lines[cand.end_line - 1]
    head = "".join(lines[cand.start_line - 1 : cand.end_line - 1]) + last.encode()[: cand.end_col].decode() + "\n"

    def n_tokens(text: str) -> int:
        return len(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)

    if n_tokens(head) > max_tokens:
        return None
    first = cand.start_line - 1  # 0-based index of the first line kept
    low, high = 0, first  # binary search for the earliest context line that still fits
    while low < high:
        mid = (low + high) // 2
        if n_tokens("".join(lines[mid:first]) + head) <= max_tokens:
            high = mid
        else:
            low = mid + 1
    return "".join(lines[low:first]) + head


def file_prompts(item: default_corpus.CorpusFile, tokenizer, args: argparse.Namespace) -> list[dict]:  # noqa: ANN001
    """Up to ``--per-file`` prompts from one file, chosen by a seeded shuffle and returned in file order."""
    candidates = documented_functions(item.text)
    seen: set[str] = set()
    unique = [c for c in candidates if not (c.qualname in seen or seen.add(c.qualname))]
    file_seed = int(hashlib.sha256(f"{args.seed}:{item.relpath}".encode()).hexdigest(), 16)
    random.Random(file_seed).shuffle(unique)
    lines = item.text.splitlines(keepends=True)
    chosen: list[tuple[int, dict]] = []
    for cand in unique:
        if len(chosen) >= args.per_file:
            break
        prompt = make_prompt(lines, cand, tokenizer, args.max_tokens)
        if prompt is not None and cand.start_line > 1:
            chosen.append((cand.start_line, {"id": f"{item.relpath}:{cand.qualname}", "prompt": prompt}))
    return [record for _, record in sorted(chosen, key=lambda pair: pair[0])]


def update_manifest(out: Path) -> None:
    """If a manifest.json sits next to the prompts, refresh its sha256 entry for them."""
    manifest_path = out.parent / "manifest.json"
    if not manifest_path.exists():
        return
    manifest = json.loads(manifest_path.read_text())
    manifest.setdefault("files", {})[out.name] = hashlib.sha256(out.read_bytes()).hexdigest()
    manifest["files"] = dict(sorted(manifest["files"].items()))
    tmp = manifest_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, manifest_path)


def default_tokenizer() -> Path:
    """The shipped base model's tokenizer if exported, else the pretraining work dir's."""
    for folder in TOKENIZER_CANDIDATES:
        if (folder / "tokenizer.json").exists():
            return folder
    raise SystemExit("no tokenizer found; run `python scripts/pretrain_default.py tokenizer` first")


def main(argv: list[str] | None = None) -> None:
    """Write the prompts file."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", type=Path, default=None, help="folder loadable by AutoTokenizer")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--max-tokens", type=int, default=300)
    p.add_argument("--per-file", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-prompts", type=int, default=60)
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or default_tokenizer())
    corpus = default_corpus.load_corpus()
    records = [record for item in corpus.heldout for record in file_prompts(item, tokenizer, args)]
    if len(records) < args.min_prompts:
        raise SystemExit(f"only {len(records)} prompts, fewer than --min-prompts {args.min_prompts}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, args.out)
    update_manifest(args.out)
    files = len({r["id"].rsplit(":", 1)[0] for r in records})
    print(f"wrote {len(records)} prompts from {files} held-out files to {args.out}")


if __name__ == "__main__":
    main()
