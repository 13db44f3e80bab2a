"""The speed llama.cpp users get: llama-server greedy against llama-server with specheads' EAGLE-3 draft, or with a
separate draft model (llama.cpp's classic draft mode, ``-md draft.gguf --spec-type draft-simple``).

    python scripts/bench_llamacpp.py --server BIN --base smollm2-135m --draft-n 1 2 3 --p-min 0 0.6 [--threads 1]
    python scripts/bench_llamacpp.py --server BIN --base qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b \
        --prompts humaneval --limit 10 --draft-n 3 5 --p-min 0 0.6

Every configuration is served at once (one llama-server each, all on 127.0.0.1; an idle server uses no CPU) and the
requests are interleaved: each prompt goes to every configuration in turn, the order rotating from prompt to prompt,
so a change in machine load hits all of them alike. Prompts are MT-Bench questions by default, both turns: the
second turn follows llama-server greedy's own first answer (the same for every configuration, as specheads bench
does); ``--prompts humaneval`` / ``gsm8k`` (``--limit N``: the first N) are the code and math sets. Tokens/s
are the server's own timings of the generated tokens (``predicted_per_second``: prompt processing excluded);
acceptance is its ``draft_n_accepted / draft_n``. Every speculative output is checked against the greedy one.
Prints a table (markdown) and writes ``--out`` JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specheads.llama_server import LlamaServer


def verify_curve(server: LlamaServer, prompt: list[int], sizes=(1, 2, 3, 4, 6, 8), repeats: int = 5) -> dict:  # noqa: ANN001
    """llama.cpp's cost of one forward over q new tokens after a cached prefix (what verifying q tokens costs):
    the median ``prompt_ms`` of ``prefix + q`` tokens with the prefix in the slot's cache."""
    curve = {}
    for q in sizes:
        times = []
        for r in range(repeats + 1):
            extra = [(prompt[-1] + 7 * (r + i + 1)) % 1000 + 100 for i in range(q)]  # different each time: no reuse
            server.complete(prompt, 1, cache_prompt=True)  # the prefix, cached
            done = server.complete(prompt + extra, 1, cache_prompt=True)
            if r and int(done.timings.get("prompt_n", -1)) == q:
                times.append(float(done.timings["prompt_ms"]))
        curve[q] = statistics.median(times) if times else None
    return curve


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", type=Path, required=True, help="the llama-server binary")
    parser.add_argument("--base", default="smollm2-135m", help="a named base (its GGUF is served)")
    parser.add_argument(
        "--heads",
        help="EAGLE-3 heads: a folder or default[:VARIANT] (default: the shipped heads llama.cpp runs for --base)",
    )
    parser.add_argument(
        "--draft-model",
        help="a named base served as a classic draft model (-md, --spec-type draft-simple) instead of EAGLE-3 heads",
    )
    parser.add_argument("--prompts", default="mt-bench", help="mt-bench (both turns), humaneval, gsm8k or a file")
    parser.add_argument("--limit", type=int, help="the first N prompts (humaneval, gsm8k, a file)")
    parser.add_argument("--draft-n", type=int, nargs="+", default=[1, 2, 3], help="draft lengths to serve")
    parser.add_argument(
        "--p-min",
        type=float,
        nargs="+",
        default=[0.0],
        help="--spec-draft-p-min values: llama.cpp stops a draft at the first token below this probability",
    )
    parser.add_argument("--per-category", type=int, help="MT-Bench questions per category (default 1)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--out", type=Path, help="JSON results")
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    from specheads import assets, load_heads
    from specheads.export import export_heads
    from specheads.heads.loading import heads_path
    from specheads.llama_server import LlamaServer
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.machine import measure_load
    from specheads.prompts import load_prompts, prompt_token_ids

    work = Path(tempfile.mkdtemp(prefix="specheads-bench-llamacpp-"))
    tokenizer = load_tokenizer(args.base)
    base_gguf = assets.named_gguf(args.base)
    if args.draft_model:  # a separate draft model: its own GGUF, llama.cpp's classic draft loop
        draft, kind, spec_type = assets.named_gguf(args.draft_model), "draft", "draft-simple"
    else:  # specheads' EAGLE-3 heads, written as llama.cpp's EAGLE-3 draft GGUF
        base = load_causal_lm(args.base)
        head = load_heads(
            Path(heads_path(args.heads, args.base)) if args.heads else assets.llamacpp_heads(args.base), base
        )
        draft, kind, spec_type = work / "draft.gguf", "eagle3", "draft-eagle3"
        export_heads(head, draft, "gguf", base_model=base, dtype=args.dtype, target_gguf=base_gguf)
        del base
    per_category = args.per_category if args.per_category is not None else (1 if args.prompts == "mt-bench" else None)
    prompts = load_prompts(args.prompts, tokenizer, limit=args.limit, per_category=per_category)
    load = measure_load(2.0)
    start = time.time()
    configs = {f"{kind}-n{n}-p{p:g}": (n, p) for n in args.draft_n for p in args.p_min}
    names = ["greedy", *configs]
    spec = ["--spec-type", spec_type, "--spec-draft-n-min", "0"]
    rows: dict[str, list[dict]] = {name: [] for name in names}
    mismatches = []
    with ExitStack() as stack:
        servers = {"greedy": stack.enter_context(LlamaServer(args.server, base_gguf, threads=args.threads))}
        for name, (n, p) in configs.items():
            extra = ["-md", str(draft), *spec, "--spec-draft-n-max", str(n), "--spec-draft-p-min", str(p)]
            servers[name] = stack.enter_context(LlamaServer(args.server, base_gguf, extra, args.threads))
        turn = 0
        for prompt in prompts:
            answers: list[str] = []
            for _ in range(prompt.num_turns):
                ids = prompt_token_ids(tokenizer, prompt, answers)
                order = names[turn % len(names) :] + names[: turn % len(names)]
                outputs = {name: servers[name].complete(ids, args.max_new_tokens) for name in order}
                for name in names:
                    done = outputs[name]
                    rows[name].append({"id": prompt.id, "turn": len(answers) + 1, "category": prompt.category,
                                       "tokens": len(done.tokens), "tokens_per_s": done.tokens_per_s,
                                       "drafted": done.drafted, "accepted": done.accepted})  # fmt: skip
                    if done.tokens != outputs["greedy"].tokens:
                        mismatches.append(f"{name} {prompt.id} turn {len(answers) + 1}")
                answers.append(tokenizer.decode(outputs["greedy"].tokens, skip_special_tokens=True))
                turn += 1
        curve = verify_curve(servers["greedy"], prompt_token_ids(tokenizer, prompts[0]))
    after = measure_load(2.0)
    greedy = rows["greedy"]

    def summary(name: str) -> dict:
        mine = rows[name]
        tokens = sum(r["tokens"] for r in mine)
        seconds = sum(r["tokens"] / r["tokens_per_s"] for r in mine if r["tokens_per_s"] > 0)
        ratios = [r["tokens_per_s"] / g["tokens_per_s"] for r, g in zip(mine, greedy, strict=True) if g["tokens_per_s"]]
        drafted, accepted = sum(r["drafted"] for r in mine), sum(r["accepted"] for r in mine)
        return {"config": name, "tokens_per_s": tokens / seconds if seconds else 0.0,
                "speedup_median": statistics.median(ratios), "acceptance": accepted / drafted if drafted else None,
                "drafted": drafted, "accepted": accepted, "tokens": tokens}  # fmt: skip

    table = [summary(name) for name in names]
    base_speed = table[0]["tokens_per_s"]
    drafted_by = f"draft model {draft.name}" if args.draft_model else f"EAGLE-3 draft {args.dtype}"
    print(f"\nllama-server, {args.base} ({base_gguf.name}), {args.prompts} {len(prompts)} prompts = "
          f"{len(greedy)} requests, {args.max_new_tokens} new tokens max, T=0, {args.threads} thread(s); "
          f"{drafted_by}; load of other processes before/after: {load.busy:.1f}/{after.busy:.1f} of "
          f"{load.cores} cores; {time.time() - start:.0f} s")  # fmt: skip
    print("\n| config | tokens/s | x greedy (total) | x greedy (median per request) | acceptance | drafted |")
    print("|---|---|---|---|---|---|")
    for row in table:
        acc = f"{row['acceptance']:.3f}" if row["acceptance"] is not None else "-"
        print(f"| {row['config']} | {row['tokens_per_s']:.1f} | {row['tokens_per_s'] / base_speed:.2f}x | "
              f"{row['speedup_median']:.2f}x | {acc} | {row['drafted']} |")  # fmt: skip
    print(
        f"\nspeculative output equals greedy on {len(greedy) * len(configs) - len(mismatches)} of "
        f"{len(greedy) * len(configs)} requests" + (f"; differs: {mismatches}" if mismatches else "")
    )
    one = curve.get(1)
    if one:
        print(
            "\nllama.cpp verify cost, t(q)/t(1) for q new tokens after a cached prefix: "
            + ", ".join(f"t({q}) = {t:.1f} ms ({t / one:.2f}x)" for q, t in curve.items() if t is not None)
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "table": table,
                    "verify_curve": curve,
                    "rows": rows,
                    "mismatches": mismatches,
                    "load": [load.busy, after.busy],
                    "threads": args.threads,
                },
                indent=2,
            )
        )
    return 1 if mismatches else 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
