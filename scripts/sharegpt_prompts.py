"""First user turns of the installed ShareGPT V3 file as a distill prompts file (JSONL ``id`` + ``conversations``).

    python scripts/sharegpt_prompts.py --out data/sharegpt_prompts.jsonl [--max-prompt-tokens 256] [--limit N] \
        [--heldout N --heldout-out data/heldout_prompts.jsonl] [--turns N]

The prompts of the shipped SmolLM2 heads' training data: ``specheads distill`` regenerates the answers with the base
itself. Records are read with the training loader's rules (a truncated file yields its complete records; synonym
roles, leading assistant turns and empty conversations are normalised or skipped with counts). A prompt longer than
``--max-prompt-tokens`` tokens of the base's tokenizer is skipped: MT-Bench questions are short, and a long prompt
costs the distillation as much as its answer. A prompt whose words (lower-cased, punctuation and spacing aside) repeat
an earlier prompt's is skipped: ShareGPT holds many copies of the same first turn, and the base answers a copy
the same way. A prompt that copies an evaluation prompt (MT-Bench, HumanEval, GSM8K, the shipped prompt files;
``specheads.contamination``) is skipped too. Ids are the records' own, made unique with ``#n`` where repeated.

``--heldout N`` moves the last N kept prompts to ``--heldout-out``: distilled apart, their answers are a held-out set
that stays the same while the training file grows (the recipe's ``data.eval_paths``), and no training record can
share a prompt with them.

``--turns N`` keeps up to N user turns of each conversation: one that has more than one becomes a ``"turns"`` record
(``{"id", "turns": [...]}``, MT-Bench's form), which ``specheads distill --all-turns`` answers turn by turn, each
turn after the base's own earlier answers. A later turn is kept while it passes the first turn's checks (not empty,
not longer than ``--max-prompt-tokens``, not copying an evaluation prompt); the conversation is cut before the first
that does not. ShareGPT's later turns were written after ChatGPT's answers, not the base's, so some refer to text
the base never wrote: they still teach the heads the base's answers in a long context. Deduplication is by the
first turn. ``--turns 1`` (the default) writes the first turns alone, as before.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", default="smollm2-135m", help="whose tokenizer measures prompt lengths")
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, help="stop after keeping N prompts, held-out ones included (quick runs)")
    parser.add_argument("--heldout", type=int, default=0, help="move the last N kept prompts to --heldout-out")
    parser.add_argument("--heldout-out", help="where the held-out prompts go (with --heldout)")
    parser.add_argument("--turns", type=int, default=1, help="user turns kept a conversation (default 1: the first)")
    args = parser.parse_args(argv)
    # imported once the arguments are read: --help and a usage error answer without loading torch
    from specheads.contamination import evaluation_index, words
    from specheads.loading import load_tokenizer
    from specheads.training.files import sharegpt_path
    from specheads.training.json_stream import read_sharegpt_conversations

    if args.heldout < 0 or bool(args.heldout) != bool(args.heldout_out):
        parser.error("--heldout N (N >= 1) and --heldout-out FILE go together")
    if args.turns < 1:
        parser.error(f"--turns must be >= 1, got {args.turns}")
    tokenizer = load_tokenizer(args.base)
    seen: dict[str, int] = {}
    texts: set[tuple[str, ...]] = set()
    index = evaluation_index()
    skipped_long = repeated = copied = multi_turn = later_turns = shortened = 0
    kept: list[str] = []

    def fault(turn: str) -> str | None:
        if not turn.strip():
            return "empty"
        if len(tokenizer(turn, add_special_tokens=False)["input_ids"]) > args.max_prompt_tokens:
            return "long"
        return "copied" if index.match([turn]) is not None else None

    for record_id, messages in read_sharegpt_conversations(sharegpt_path()):
        users = [m["content"] for m in messages if m["role"] == "user"]
        first = users[0] if users else None
        if not first or not first.strip():
            continue
        problem = fault(first)
        if problem == "long":
            skipped_long += 1
            continue
        if problem == "copied":
            copied += 1
            continue
        key = words(first)
        if key in texts:
            repeated += 1
            continue
        texts.add(key)
        count = seen.get(record_id, 0)
        seen[record_id] = count + 1
        unique = record_id if count == 0 else f"{record_id}#{count}"
        turns = [first]
        for turn in users[1 : args.turns]:
            if fault(turn) is not None:
                shortened += 1
                break
            turns.append(turn)
        if len(turns) > 1:
            line = {"id": unique, "turns": turns}
            multi_turn += 1
            later_turns += len(turns) - 1
        else:
            line = {"id": unique, "conversations": [{"from": "human", "value": first}]}
        kept.append(json.dumps(line, ensure_ascii=False) + "\n")
        if args.limit is not None and len(kept) >= args.limit:
            break
    if args.heldout >= len(kept):
        raise SystemExit(f"--heldout {args.heldout} leaves no training prompt of the {len(kept)} kept")
    cut = len(kept) - args.heldout
    for path, lines in ((args.out, kept[:cut]), (args.heldout_out, kept[cut:])):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text("".join(lines), encoding="utf-8")
    held = f" and {args.heldout} held-out prompts to {args.heldout_out}" if args.heldout else ""
    if args.turns > 1:
        print(
            f"{multi_turn} conversations keep more than one turn ({later_turns} later turns, up to {args.turns} "
            f"turns each); {shortened} cut before a later turn that is empty, too long or copies an evaluation prompt"
        )
    print(
        f"wrote {cut} prompts to {args.out}{held}; skipped {skipped_long} longer than {args.max_prompt_tokens} tokens, "
        f"{repeated} repeating an earlier prompt, {copied} copying an evaluation prompt ({index.describe()})"
    )


if __name__ == "__main__":
    main()
