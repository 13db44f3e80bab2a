"""First user turns of the installed ShareGPT V3 file as a distill prompts file (JSONL ``id`` + ``conversations``).

    python scripts/sharegpt_prompts.py --out data/sharegpt_prompts.jsonl [--max-prompt-tokens 256] [--limit N]

The prompts of the shipped SmolLM2 heads' training data: ``specheads distill`` regenerates the answers with the base
itself. Records are read with the training loader's rules (a truncated file yields its complete records; synonym
roles, leading assistant turns and empty conversations are normalised or skipped with counts). A prompt longer than
``--max-prompt-tokens`` tokens of the base's tokenizer is skipped: MT-Bench questions are short, and a long prompt
costs the distillation as much as its answer. A prompt whose words (lower-cased, punctuation and spacing aside) repeat
an earlier prompt's is skipped: ShareGPT holds many copies of the same first turn, and the base answers a copy
the same way. A prompt that copies an evaluation prompt (MT-Bench, HumanEval, GSM8K, the shipped prompt files;
``specheads.contamination``) is skipped too. Ids are the records' own, made unique with ``#n`` where repeated.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specheads.contamination import evaluation_index, words
from specheads.loading import load_tokenizer
from specheads.training.data import read_sharegpt_conversations, sharegpt_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", default="smollm2-135m", help="whose tokenizer measures prompt lengths")
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, help="stop after writing N prompts (quick runs)")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.base)
    seen: dict[str, int] = {}
    texts: set[tuple[str, ...]] = set()
    index = evaluation_index()
    written = skipped_long = repeated = copied = 0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with Path(args.out).open("w", encoding="utf-8") as handle:
        for record_id, messages in read_sharegpt_conversations(sharegpt_path()):
            first = next((m["content"] for m in messages if m["role"] == "user"), None)
            if not first or not first.strip():
                continue
            if len(tokenizer(first, add_special_tokens=False)["input_ids"]) > args.max_prompt_tokens:
                skipped_long += 1
                continue
            if index.match([first]) is not None:
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
            line = {"id": unique, "conversations": [{"from": "human", "value": first}]}
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
            written += 1
            if args.limit is not None and written >= args.limit:
                break
    print(
        f"wrote {written} prompts to {args.out}; skipped {skipped_long} longer than {args.max_prompt_tokens} tokens, "
        f"{repeated} repeating an earlier prompt, {copied} copying an evaluation prompt ({index.describe()})"
    )


if __name__ == "__main__":
    main()
