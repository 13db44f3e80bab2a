"""The options dataclasses the command line is generated from: each command parses to its dataclass's defaults, those
defaults are the Python calls' own, the checks refuse in Python what the command refuses, and the method and format
choices are the registry's when the parser is built."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from specheads.cli import COMMANDS, build_parser
from specheads.options import (
    BenchOptions,
    CalibrateOptions,
    DemoOptions,
    DistillOptions,
    DrafterOptions,
    ExportOptions,
    GenerateOptions,
    LookupOptions,
    MachineOptions,
    SamplingOptions,
    ServerOptions,
    TrainOptions,
    from_namespace,
)
from specheads.registry import HEAD_TYPES

# What a command needs besides its required options for its options to be complete.
EXTRA = {"export": ["--check", "exported"]}
DISTILL = {"base": "b", "prompts": "p", "out": "o"}


def _required(options: type) -> dict[str, str]:
    """A value for each field without a default (a required option)."""
    return {item.name: "x" for item in dataclasses.fields(options) if item.default is dataclasses.MISSING
            and item.default_factory is dataclasses.MISSING}  # fmt: skip


@pytest.mark.parametrize("options", [options for options, _ in COMMANDS], ids=lambda options: options.COMMAND)
def test_a_command_given_only_its_required_options_parses_to_its_dataclass_defaults(options: type) -> None:
    """Every option left off the command line gets the default the dataclass declares (the parser is generated from
    it), in every group; list defaults are fresh lists, never one shared between instances."""
    required = _required(options)
    argv = [options.COMMAND, *(item for name, value in required.items() for item in (f"--{name}", value))]
    parsed = from_namespace(options, build_parser().parse_args([*argv, *EXTRA.get(options.COMMAND, [])]))
    first, second = (options(**required, **({"check": "exported"} if options is ExportOptions else {})) for _ in "12")
    assert parsed == first
    assert all(value is not getattr(second, name) for name, value in vars(first).items() if isinstance(value, list))


def _defaults(call: Callable[..., Any]) -> dict[str, Any]:
    parameters = inspect.signature(call).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def _same(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _shared() -> list[tuple[Any, Callable[..., Any], tuple[str, ...]]]:
    """(options, the Python call its fields feed, the fields named as that call's keywords)."""
    from specheads import SpecDecoder
    from specheads.bench import build_methods, run_bench
    from specheads.calibrate import calibrate
    from specheads.demo import run_demo
    from specheads.export.formats import export_named
    from specheads.inference.generation import GenerationConfig
    from specheads.train import run
    from specheads.training.distill import distill
    from specheads.training.distill_server import distill_server

    generation = ("max_new_tokens", "acceptance", "seed", "tree_top_k", "depth", "total_tokens")
    return [
        (SamplingOptions(), GenerationConfig, ("temperature", "top_p", "top_k")),
        (SamplingOptions(), distill, ("temperature", "top_p", "top_k")),
        (GenerateOptions(base="x"), GenerationConfig, generation),
        (DrafterOptions(), GenerationConfig, ("tree",)),
        (DrafterOptions(), SpecDecoder.from_pretrained, ("heads", "draft_model", "num_speculative_tokens")),
        (GenerateOptions(base="x"), SpecDecoder.from_pretrained, ("method",)),
        (MachineOptions(), SpecDecoder.from_pretrained, ("device", "dtype")),
        (LookupOptions(), calibrate, ("prompt_lookup", "lookup_corpus")),
        (DemoOptions(), run_demo, ("max_new_tokens", "prompt_index")),
        (MachineOptions(), run_demo, ("threads", "dtype")),
        (TrainOptions(), run, ("threads", "dtype")),
        (BenchOptions(base="x", out="o"), build_methods, ("lookup_k",)),
        (BenchOptions(base="x", out="o"), run_bench, ("repeats",)),
        (
            DistillOptions(base="x", prompts="p", out="o"),
            distill,
            ("max_new_tokens", "batch_size", "seed", "all_turns", "exclude_prompts", "allow_evaluation_prompts"),
        ),
        (ServerOptions(), distill_server, ("concurrency", "retries")),
        (
            ExportOptions(check="x"),
            export_named,
            ("base", "engines", "num_speculative_tokens", "dtype", "target_gguf"),
        ),
    ]


def test_an_option_defaults_to_what_the_python_call_it_feeds_defaults_to() -> None:
    """A field is named as the keyword of the call it feeds, so `specheads X` and the Python call agree when an
    option is left out."""
    for options, call, names in _shared():
        defaults = _defaults(call)
        for name in names:
            assert name in defaults, f"{call.__qualname__} has no keyword {name}"
            option, python = _same(getattr(options, name)), _same(defaults[name])
            assert option == python, f"{type(options).__name__}.{name} = {option!r}, {call.__qualname__}: {python!r}"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DistillOptions(**DISTILL, drafter=DrafterOptions(tree="chain-2")), "need --heads or --draft-model"),
        (
            lambda: DistillOptions(
                **DISTILL, server=ServerOptions(server="http://x"), sampling=SamplingOptions(top_k=5)
            ),
            "--server generates on the server",
        ),
        (lambda: CalibrateOptions(heads="default"), "the shipped default heads are calibrated when shipped"),
        (lambda: CalibrateOptions(heads="h", overrides=["train.lr=1"]), "overrides apply to a recipe: give --config"),
        (lambda: BenchOptions(base="b", out="o", trees=["hydra=chain-2"]), "write TYPE=T1,T2"),
        (lambda: ExportOptions(heads="h"), "export needs --format, --out"),
    ],
)
def test_the_options_refuse_in_python_what_the_command_refuses(build: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_method_and_format_choices_are_the_registry_s_when_the_parser_is_built(monkeypatch) -> None:
    """A method registered after the CLI was imported is a --method, --trees and --format choice of the next parser."""
    entry = dataclasses.replace(HEAD_TYPES["medusa"], name="late", formats=("late-format",), layouts=())
    monkeypatch.setitem(HEAD_TYPES, "late", entry)
    commands = build_parser()._subparsers._group_actions[0].choices
    assert "late" in commands["generate"]._option_string_actions["--method"].choices
    assert "late-format" in commands["export"]._option_string_actions["--format"].choices
    assert "late=chain-2,chain-3,binary-7" in commands["bench"]._option_string_actions["--trees"].help
    assert BenchOptions(base="b", out="o", trees=["late=chain-2"]).tree_lists() == {"late": ["chain-2"]}


def _option_help(command: str, flag: str) -> str:
    """The help line of ``flag`` in ``specheads COMMAND --help``, as argparse formats it (joined, spaces squeezed)."""
    parser = build_parser()
    sub = next(action for action in parser._actions if action.dest == "command").choices[command]
    action = next(action for action in sub._actions if flag in action.option_strings)
    return " ".join((action.help or "").split())


@pytest.mark.parametrize(
    "command, flag, shown",
    [
        ("generate", "--max-new-tokens", "default: 128"),  # an option without a text
        ("generate", "--acceptance", "acceptance rule (default: auto)"),
        ("bench", "--batch-size", "(default: 1)"),
    ],
)
def test_the_help_shows_each_option_s_default(command: str, flag: str, shown: str) -> None:
    """``--help`` says what an option left off means: the dataclass default, appended to the option's text."""
    assert shown in _option_help(command, flag)


@pytest.mark.parametrize(
    "command, flag",
    [("generate", "--stats"), ("generate", "--heads"), ("generate", "--temperature"), ("generate", "--threads")],
)
def test_the_help_adds_no_default_to_a_switch_a_none_or_a_text_that_says_it(command: str, flag: str) -> None:
    """A switch, an option defaulting to ``None`` and a text that already names its default get no second one."""
    text = _option_help(command, flag)
    assert text.lower().count("default") <= 1
    assert "(default: False)" not in text and "(default: None)" not in text
