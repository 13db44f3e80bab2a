"""Keep a distillation's answers in the repository and rebuild its training file from them.

Distilling thousands of prompts on a CPU takes hours; the answers are the expensive part, the prompts come from an
installed package in a minute. ``pack`` stores the answers of a distill (or joined) file in file order, as
xz-compressed JSONL shards of ``--shard`` records holding ``id``, ``response`` (a multi-turn record's answers to
every turn as ``responses`` instead) and ``provenance`` alone (no prompt text); ``unpack`` rebuilds the same
records, in the same order, from the prompts files and the base's tokenizer (rendered as ``specheads distill``
renders them), and checks each rebuilt record against nothing but its shard.

    python scripts/distilled_shards.py pack data/smollm2-135m/distilled.jsonl --out data/smollm2-135m/responses
    python scripts/sharegpt_prompts.py --out data/smollm2-135m/sharegpt_prompts.jsonl
    python scripts/distilled_shards.py unpack data/smollm2-135m/responses --base smollm2-135m \\
        --prompts data/smollm2-135m/sharegpt_prompts.jsonl --out data/smollm2-135m/distilled.jsonl

A distillation that grew first turns, then whole conversations (``distill --all-turns`` on a ``--turns 2`` prompts
file after a first-turn one, which share their ids), unpacks from both prompts files: each record is rebuilt from the
first prompt of its id with at least as many turns as it has answers.

A shard whose content is unchanged is not rewritten (a file that grew at its end, ``join_distilled.py --grow``,
rewrites only its last shard), so the history holds each full shard once.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
from collections.abc import Iterator
from pathlib import Path

SHARD = "responses-{:05d}.jsonl.xz"


def read_records(path: Path) -> Iterator[dict]:
    for number, line in enumerate(path.open(encoding="utf-8"), 1):
        if line.strip():
            try:
                yield json.loads(line)
            except ValueError as error:
                raise SystemExit(f"{path}:{number}: not a JSON record ({error}); join the files first") from error


def saved_answers(record: dict) -> dict:
    """What a shard keeps of a distill record: its id, its answer (or answers, one per turn) and provenance."""
    answers = {"responses": record["responses"]} if "responses" in record else {"response": record["response"]}
    return {"id": record["id"], **answers, "provenance": record.get("provenance", {})}


def pack(source: Path, out: Path, shard_size: int) -> tuple[int, int]:
    """Write ``source``'s answers as shards under ``out``; returns (records, shards written)."""
    records = [json.dumps(saved_answers(record), ensure_ascii=False) for record in read_records(source)]
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for index, start in enumerate(range(0, len(records), shard_size)):
        content = ("\n".join(records[start : start + shard_size]) + "\n").encode("utf-8")
        path = out / SHARD.format(index)
        if path.exists() and lzma.decompress(path.read_bytes()) == content:
            continue
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_bytes(lzma.compress(content, preset=9 | lzma.PRESET_EXTREME))
        os.replace(temporary, path)
        written += 1
    return len(records), written


def unpack(shards: Path, prompt_paths: list[Path], base: str, out: Path) -> int:
    """Rebuild the training file from ``shards`` and the prompts; returns the records written."""
    from specheads.loading import load_tokenizer
    from specheads.prompts import load_prompts
    from specheads.training.distill import build_record

    tokenizer = load_tokenizer(base)
    prompts: dict[str, list] = {}  # every prompt of an id, in the order given
    for path in prompt_paths:
        for prompt in load_prompts(path, tokenizer=tokenizer):
            prompts.setdefault(prompt.id, []).append(prompt)
    files = sorted(shards.glob(SHARD.replace("{:05d}", "*")))
    if not files:
        raise SystemExit(f"{shards}: no {SHARD.format(0)}-style shards")
    temporary = out.with_name(f".{out.name}.tmp")
    count, missing = 0, []
    with temporary.open("w", encoding="utf-8") as handle:
        for path in files:
            for line in lzma.decompress(path.read_bytes()).decode("utf-8").splitlines():
                saved = json.loads(line)
                answers = saved["responses"] if "responses" in saved else saved["response"]
                asked = len(answers) if isinstance(answers, list) else 1
                prompt = next((p for p in prompts.get(saved["id"], []) if p.num_turns >= asked), None)
                if prompt is None:
                    missing.append(saved["id"] if asked == 1 else f"{saved['id']} ({asked} turns)")
                    continue
                record = build_record(prompt, tokenizer, answers, saved["provenance"])
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
    if missing:
        temporary.unlink()
        raise SystemExit(
            f"{len(missing)} saved answers have no prompt in {', '.join(map(str, prompt_paths))} (first: "
            f"{missing[0]!r}); give the prompts files the distillation read"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(temporary, out)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="store a distill file's answers as compressed shards")
    packing.add_argument("source", type=Path)
    packing.add_argument("--out", type=Path, required=True)
    packing.add_argument("--shard", type=int, default=1000, help="records a shard")
    unpacking = commands.add_parser("unpack", help="rebuild the distill file from the shards and the prompts")
    unpacking.add_argument("shards", type=Path)
    unpacking.add_argument("--prompts", type=Path, nargs="+", required=True)
    unpacking.add_argument("--base", required=True, help="the base whose tokenizer and chat template render prompts")
    unpacking.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "pack":
        records, written = pack(args.source, args.out, args.shard)
        print(f"{args.out}: {records} answers, {written} shards written")
    else:
        print(f"{args.out}: {unpack(args.shards, args.prompts, args.base, args.out)} records")


if __name__ == "__main__":
    main()
