"""Join distillation outputs written by several processes into one training file.

Each ``specheads distill`` process writes its own JSONL (one per slice of the prompts, so that two processes never
append to one file). This joins them in the order given, keeping the first record of each id and of each first user
turn: a prompt asked twice (the same turn under two ids, or an earlier run over unscreened prompts) would otherwise
enter training twice, with answers that may differ between batches. Unreadable lines (a process killed mid-write)
are skipped and counted.

With ``--grow`` an existing ``--out`` keeps every record in its place and only records it does not hold are appended,
so the training file only ever grows at its end: the feature cache grows with it (its first rows stay valid) and a
run on ``data.limit`` records trains on the same records before and after the file grew.

    python scripts/join_distilled.py data/smollm2-135m/distilled-bf16.jsonl data/smollm2-135m/distilled-bf16-b.jsonl \
        data/smollm2-135m/distilled-bf16-c.jsonl --out data/smollm2-135m/distilled.jsonl
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
from collections import Counter
from pathlib import Path


def first_user_turn(record: dict) -> str:
    """The record's first human turn, lower-cased with whitespace collapsed ("" when it has none)."""
    turns = record.get("conversations")
    if isinstance(turns, str):  # written as a Python literal by older distill runs
        try:
            turns = ast.literal_eval(turns)
        except (ValueError, SyntaxError):
            turns = None
    for turn in turns or []:
        if isinstance(turn, dict) and turn.get("from") in ("human", "user"):
            return re.sub(r"\s+", " ", str(turn.get("value", ""))).strip().lower()
    return ""


def join(paths: list[Path], out: Path, grow: bool = False) -> Counter:
    """Write the kept records of ``paths`` to ``out`` (atomically) and return the counts of kept and dropped.

    With ``grow`` an existing ``out`` is read first and kept whole, in its order ("already in out"); the records of
    ``paths`` it does not hold follow it.
    """
    counts: Counter = Counter()
    if grow and out.exists():
        paths = [out, *paths]
    ids: set[str] = set()
    turns: set[str] = set()
    temporary = out.with_name(f".{out.name}.tmp")
    with temporary.open("w") as handle:
        for path in paths:
            for line in path.open():
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    counts["unreadable"] += 1
                    continue
                turn = first_user_turn(record)
                if record.get("id") in ids:
                    counts["repeated id"] += 1
                elif turn and turn in turns:
                    counts["repeated first turn"] += 1
                else:
                    ids.add(record.get("id"))
                    turns.add(turn)
                    handle.write(line if line.endswith("\n") else line + "\n")
                    counts["already in out" if grow and path == out else "kept"] += 1
    os.replace(temporary, out)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="distill outputs, in order (the first record wins)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--grow", action="store_true", help="keep an existing --out as it is and append only the records it lacks"
    )
    args = parser.parse_args()
    if args.grow and args.out.resolve() in {path.resolve() for path in args.paths}:
        parser.error("--grow reads --out itself; do not also list it among the inputs")
    counts = join(args.paths, args.out, grow=args.grow)
    print(f"{args.out}: " + ", ".join(f"{key} {value}" for key, value in counts.most_common()))


if __name__ == "__main__":
    main()
