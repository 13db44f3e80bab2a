"""The command line as wiring: the evaluation-prompt screen of the library's distill(), the options dataclasses that
generate the parser (defaults shared with the Python API), the tree names read from their method's folder."""

from mutations import Mutation

DISTILL_TESTS = "tests/training/test_distill.py"
EAGLE_ROWS = "tests/test_bench.py::test_the_default_eagle_rows_are_the_ones_the_readme_names"
OPTIONS_TESTS = "tests/test_options.py"
PARSED_DEFAULTS = f"{OPTIONS_TESTS}::test_a_command_given_only_its_required_options_parses_to_its_dataclass_defaults"

MUTATIONS = (
    Mutation(
        "distill-library-unscreened",
        "the library's distill() writes prompts that copy an evaluation prompt: only the command screens them",
        "specheads/training/distill.py",
        "    if not allow_evaluation_prompts:\n"
        "        prompts = without_evaluation_prompts(prompts, exclude_prompts)\n",
        "",
        (f"{DISTILL_TESTS}::test_the_library_call_skips_evaluation_prompts_unless_allowed",),
    ),
    Mutation(
        "eagle-bench-rows-lose-dynamic",
        "EAGLE's default bench trees, moved into its folder, lose the dynamic tree: no eagle-dynamic row by default",
        "specheads/methods/eagle/names.py",
        '("chain-3", "chain-5", "binary-7", KIND, f"{KIND}-4-5-16", "auto")',
        '("chain-3", "chain-5", "binary-7", f"{KIND}-4-5-16", "auto")',
        (EAGLE_ROWS,),
    ),
    Mutation(
        "named-bench-trees-unresolved",
        "an entry whose bench_trees names them as module:attribute gets no default rows (the name is not resolved)",
        "specheads/registry.py",
        "        return tuple(_resolve(self.bench_trees)) if isinstance(self.bench_trees, str) else self.bench_trees",
        "        return () if isinstance(self.bench_trees, str) else self.bench_trees",
        (EAGLE_ROWS,),
    ),
    Mutation(
        "eagle-names-import-torch",
        "EAGLE's tree names module imports torch: specheads --help (which lists the default bench trees) loads it",
        "specheads/methods/eagle/names.py",
        "from __future__ import annotations\n",
        "from __future__ import annotations\n\nimport torch  # noqa: F401\n",
        ("tests/test_machine.py::test_help_does_not_import_torch",),
    ),
    # -------------------------------------------------------------------- the parser generated from the options
    Mutation(
        "option-default-lost",
        "the generated parser loses the dataclass defaults: an option left off parses to None",
        "specheads/options.py",
        '            keywords["default"] = item.default\n',
        '            keywords["default"] = None\n',
        (PARSED_DEFAULTS,),
    ),
    Mutation(
        "help-hides-defaults",
        "--help shows no option's default (what an option left off means is unsaid)",
        "specheads/options.py",
        '        keywords["help"] = _with_default(keywords["help"], keywords.get("default"), keywords.get("action"))\n',
        "",
        (f"{OPTIONS_TESTS}::test_the_help_shows_each_option_s_default",),
    ),
    Mutation(
        "help-shows-switch-default",
        "--help writes (default: False) after every switch and (default: None) after options without one",
        "specheads/options.py",
        '    if default is None or action in ("store_true", "store_false") or default == []',
        "    if default == []",
        (f"{OPTIONS_TESTS}::test_the_help_adds_no_default_to_a_switch_a_none_or_a_text_that_says_it",),
    ),
    Mutation(
        "list-default-shared",
        "a list default (--heads, --exclude-prompts, ...) is one list shared by every options instance",
        "specheads/options.py",
        "        return field(default_factory=default.copy, metadata=metadata)",
        "        return field(default_factory=lambda: default, metadata=metadata)",
        (PARSED_DEFAULTS,),
    ),
    Mutation(
        "distill-option-default-differs",
        "distill --max-new-tokens defaults to 128 while distill() defaults to 256",
        "specheads/options.py",
        "    max_new_tokens: int = _max_new_tokens(256)\n",
        "    max_new_tokens: int = _max_new_tokens()\n",
        (f"{OPTIONS_TESTS}::test_an_option_defaults_to_what_the_python_call_it_feeds_defaults_to",),
    ),
    Mutation(
        "drafters-not-exclusive",
        "the generated parser takes --heads and --draft-model together (no mutually exclusive group)",
        "specheads/options.py",
        "        if spec.exclusive:\n"
        "            exclusive = exclusive or target.add_mutually_exclusive_group()\n"
        '        flag = spec.flag or "--" + item.name.replace("_", "-")\n'
        "        (exclusive if spec.exclusive else target).add_argument(flag, dest=item.name, **keywords)",
        '        flag = spec.flag or "--" + item.name.replace("_", "-")\n'
        "        target.add_argument(flag, dest=item.name, **keywords)",
        ("tests/test_cli.py::test_counts_below_one_and_conflicting_drafters_are_usage_errors",),
    ),
    Mutation(
        "distill-tree-without-drafter-accepted",
        "DistillOptions takes --tree without --heads or --draft-model (the check lost in the move out of the CLI)",
        "specheads/options.py",
        "        if not self.speculative and (drafter.tree is not None or drafter.num_speculative_tokens is not None)"
        ":\n",
        "        if False:\n",
        (f"{OPTIONS_TESTS}::test_the_options_refuse_in_python_what_the_command_refuses",),
    ),
    Mutation(
        "method-choices-frozen-at-import",
        "--method's choices are read from the registry when specheads.options is imported, not at build_parser()",
        "specheads/options.py",
        "choices=method_choices)",
        "choices=method_choices())",
        (f"{OPTIONS_TESTS}::test_method_and_format_choices_are_the_registry_s_when_the_parser_is_built",),
    ),
)
