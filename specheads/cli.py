"""The ``specheads`` command line, as wiring: each command's options are a dataclass of :mod:`specheads.options`
(shared with the Python API, which checks them), its parser is generated from that dataclass, and its handler hands
the options to the library and prints what comes back."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from specheads.arguments import check_output_path
from specheads.extras import EXTRAS, install_hint
from specheads.options import (  # noqa: F401 - ACCEPTANCE_CHOICES: the acceptance choices, read from here too
    ACCEPTANCE_CHOICES,
    BenchOptions,
    CalibrateOptions,
    DemoOptions,
    DistillOptions,
    ExportOptions,
    GenerateOptions,
    TrainOptions,
    add_options,
    from_namespace,
)
from specheads.registry import export_format

if TYPE_CHECKING:
    from specheads.inference.decoder import GenerationOutput
    from specheads.machine import MachineLoad


def _generate(options: GenerateOptions) -> int:
    from specheads import SpecDecoder
    from specheads.inference.generation import GenerationConfig
    from specheads.loading import load_tokenizer
    from specheads.prompts import chat_text

    _set_threads(options.machine.threads)
    prompt = _generate_prompt(options)
    tokenizer = None
    if not isinstance(prompt, str):  # a conversation: check it renders before any model loads
        tokenizer = load_tokenizer(options.base)
        chat_text(tokenizer, prompt)
    config = GenerationConfig(**options.generation_keywords())  # checked before any model loads
    decoder = SpecDecoder.from_pretrained(options.base, tokenizer=tokenizer, **options.decoder_keywords())
    _note_cut(_print_generation(decoder, prompt, config, as_json=options.json, stats=options.stats))
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


def _generate_prompt(options: GenerateOptions) -> str | list[dict[str, str]]:
    """PROMPT as given (a string), or the conversation that --chat / --messages make of it."""
    from specheads.prompts import decode_utf8, read_conversation

    text = options.prompt
    if text == "-":
        text = decode_utf8(sys.stdin.buffer.read(), "standard input")
    if options.messages is None:
        if text is None:
            raise ValueError("give a PROMPT (or a conversation with --messages FILE.json)")
        return [{"role": "user", "content": text}] if options.chat else text
    return read_conversation(options.messages) + ([{"role": "user", "content": text}] if text is not None else [])


def _note_cut(out: GenerationOutput) -> None:
    """Say on stderr when the model's position limit cut the output short of --max-new-tokens."""
    if out.finish_reason == "max_length":
        _say("generate")(
            f"note: stopped after {len(out.new_tokens)} new tokens at the model's position limit "
            f"({out.sequences.shape[1]} tokens with the prompt); {out.tokens_cut} of the tokens asked for did not fit"
        )


def _bench(options: BenchOptions) -> int:
    from specheads.bench import benchmark
    from specheads.bench_report import markdown_table, write_report

    check_output_path(options.out, "directory")  # before the benchmark runs, not after it
    load = _set_threads(options.machine.threads)
    _warn_if_busy(load)
    report, during = benchmark(options, load, command="specheads " + " ".join(sys.argv[1:]))
    written = write_report(report, options.out)
    print(markdown_table(report))
    print(f"wrote {', '.join(f'{options.out}/{name}' for name in written)}")
    _warn_if_busy(during, "while the benchmark ran")
    return 0


def _demo(options: DemoOptions) -> int:
    from specheads.demo import run_demo

    machine = options.machine
    return run_demo(options.max_new_tokens, options.prompt_index, threads=machine.threads, dtype=machine.dtype)


def _train(options: TrainOptions) -> int:
    from specheads.train import run

    return run(options.config, options.overrides, options.threads, options.dtype)


def _distill(options: DistillOptions) -> int:
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.prompts import load_prompts
    from specheads.training.distill import check_settings, check_unique_ids, read_finished, without_evaluation_prompts

    _set_threads(options.machine.threads)
    check_settings(options.max_new_tokens, options.batch_size, **vars(options.sampling))
    check_output_path(options.out, "file")
    tokenizer = load_tokenizer(options.base)
    prompts = load_prompts(options.prompts, tokenizer, limit=options.limit)
    check_unique_ids(prompts)
    if not options.allow_evaluation_prompts:  # before any model loads; distill() screens them too
        prompts = without_evaluation_prompts(prompts, options.exclude_prompts, log=_say("distill"))
    multi_turn = sum(prompt.num_turns > 1 for prompt in prompts)
    if multi_turn and not options.all_turns:
        _say("distill")(
            f"note: {multi_turn} of {len(prompts)} prompts have more than one turn; each record holds the response to "
            "the first turn only (--all-turns answers them all)"
        )
    finished = read_finished(options.out)  # before loading the model: a bad --out fails fast
    if all(prompt.id in finished for prompt in prompts):
        print(f"{options.out} already holds all {len(prompts)} prompts; nothing to do")
        return 0
    if options.server.server is not None:
        result = _distill_on_server(options, tokenizer, prompts)
        _print_distilled(result, options.out, len(prompts), f" ({options.server.concurrency} in flight)")
        return 0
    base = load_causal_lm(options.base, dtype=options.machine.dtype, device=options.machine.device)
    result, drafter = _distill_here(options, base, tokenizer, prompts)
    tau = "" if drafter is None else f", tau {result.mean_accepted_length:.2f} ({drafter})"
    _print_distilled(result, options.out, len(prompts), tau)
    return 0


def _distill_keywords(options: DistillOptions) -> dict[str, Any]:
    """The keywords ``distill`` and ``distill_server`` share, from ``options``."""
    return {
        "max_new_tokens": options.max_new_tokens,
        "temperature": options.sampling.temperature,
        "top_p": options.sampling.top_p,
        "seed": options.seed,
        "use_chat_template": not options.no_chat_template,
        "all_turns": options.all_turns,
        "exclude_prompts": options.exclude_prompts,
        "allow_evaluation_prompts": options.allow_evaluation_prompts,
    }


def _distill_on_server(options: DistillOptions, tokenizer: Any, prompts: list) -> Any:
    from specheads.training.distill_server import distill_server

    server = options.server
    return distill_server(
        server.server, tokenizer, prompts, options.out, concurrency=server.concurrency, retries=server.retries,
        model=server.server_model, **_distill_keywords(options),
    )  # fmt: skip


def _distill_here(options: DistillOptions, base: Any, tokenizer: Any, prompts: list) -> tuple[Any, str | None]:
    """Distill with ``base`` loaded here, speculatively with --heads or --draft-model; the result and the drafter's
    name (None without speculation)."""
    from specheads.training.distill import distill, speculative_decoder

    drafter = options.drafter
    decoder = None
    if options.speculative:
        decoder = speculative_decoder(base, tokenizer, drafter.heads, drafter.draft_model, base_name=options.base)
    decoder_options = {"tree": drafter.tree, "num_speculative_tokens": drafter.num_speculative_tokens}
    decoder_options = {key: value for key, value in decoder_options.items() if value is not None}
    result = distill(
        base, tokenizer, prompts, options.out, top_k=options.sampling.top_k, batch_size=options.batch_size,
        decoder=decoder, decoder_options=decoder_options, **_distill_keywords(options),
    )  # fmt: skip
    return result, None if decoder is None else decoder.drafter.name


def _print_distilled(result, out: str, prompts: int, extra: str) -> None:  # noqa: ANN001 - a DistillResult
    print(f"wrote {result.written} records to {out} ({prompts - result.written} were already there)")
    print(f"{result.new_tokens} tokens in {result.generate_time_s:.2f}s: {result.tokens_per_s:.1f} tokens/s{extra}")


def _calibrate(options: CalibrateOptions) -> int:
    from specheads.calibrate import calibrate, heldout_rows, write_calibration
    from specheads.heads import load_heads
    from specheads.inference.lookup import read_corpus
    from specheads.loading import load_causal_lm, load_tokenizer

    _set_threads(options.machine.threads)
    base_name, dataset = heldout_rows(
        options.config, options.base, options.data, options.format, options.max_length, overrides=options.overrides
    )
    corpus_path = options.lookup.lookup_corpus
    corpus = read_corpus(corpus_path, load_tokenizer(base_name)) if corpus_path else None
    base = load_causal_lm(base_name, dtype=options.machine.dtype, device=options.machine.device)
    heads = load_heads(options.heads, base)
    sizes = {"max_nodes": options.max_nodes, "prompt_tokens": options.prompt_tokens, "new_tokens": options.new_tokens}
    result = calibrate(
        base, heads, dataset, batches=options.batches, log=lambda line: print(f"calibrate: {line}", flush=True),
        prompt_lookup=options.lookup.prompt_lookup, lookup_corpus=corpus, **sizes,
    )  # fmt: skip
    path = write_calibration(options.heads, result.record)
    print(result.summary(path))
    return 0


def _export(options: ExportOptions) -> int:
    from specheads.export import check_export
    from specheads.export.formats import export_named

    if options.check:
        report = check_export(options.check, options.format, target=options.target_gguf)
        print(report.render())
        for problem in report.all_problems():
            print(f"problem: {problem}", file=sys.stderr)
        return 0 if report.ok else 1
    one_file = bool(export_format(options.format).suffix)  # gguf: one file; the other formats: a directory
    check_output_path(options.out, "file" if one_file else "directory", staged=True)  # before the heads load
    result = export_named(**{name: value for name, value in vars(options).items() if name != "check"})
    print(result.render())
    return 0


def _say(command: str) -> Callable[[str], None]:
    """Print a line on stderr as ``specheads COMMAND: line``."""
    return lambda line: print(f"specheads {command}: {line}", file=sys.stderr)


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


# Each command: its options (a dataclass of specheads.options) and its handler, in the order --help lists them.
COMMANDS: tuple[tuple[type, Callable[[Any], int]], ...] = (
    (GenerateOptions, _generate),
    (BenchOptions, _bench),
    (DemoOptions, _demo),
    (DistillOptions, _distill),
    (TrainOptions, _train),
    (CalibrateOptions, _calibrate),
    (ExportOptions, _export),
)


def _handle(options: type, handler: Callable[[Any], int], args: argparse.Namespace) -> int:
    """Run ``handler`` on the options ``args`` holds (their checks refuse what the command cannot honour)."""
    return handler(from_namespace(options, args))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``specheads`` command: one subcommand for each of :data:`COMMANDS`, its arguments
    generated from its options dataclass."""
    from specheads import __version__

    parser = argparse.ArgumentParser(prog="specheads", description="Lossless speculative decoding for transformers.")
    parser.add_argument("--version", action="version", version=f"specheads {__version__}")
    subparsers = parser.add_subparsers(dest="command")
    for options, handler in COMMANDS:
        command = subparsers.add_parser(options.COMMAND, help=options.HELP, description=options.__doc__)
        add_options(command, options)
        command.set_defaults(handler=partial(_handle, options, handler))
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
