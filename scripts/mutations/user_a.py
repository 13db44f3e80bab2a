"""What a new user's run of the README hit: the cache sized past the model's positions, output paths checked late or
as the wrong kind, an engine said to load a file with problems, a test command that passes on nothing, and an
optional dependency taken for installed when only a test folder of its name is on ``sys.path``."""

from mutations import Mutation

_OUT_TEST = "tests/test_cli.py::test_an_unwritable_out_is_one_line_naming_it_before_any_work"

MUTATIONS = (
    Mutation(
        "cache-sized-by-max-new-tokens",
        "the token buffer and the caches are sized by prompt + max_new_tokens, past the model's positions",
        "specheads/inference/decoder.py",
        "            slots = min(slots, max_length)\n",
        "            slots = max(slots, max_length)\n",
        (
            "tests/inference/test_bad_input.py::"
            "test_a_huge_max_new_tokens_allocates_only_what_the_model_positions_can_use",
        ),
    ),
    Mutation(
        "bench-out-unchecked",
        "bench checks --out only when it writes the report, after the whole benchmark ran",
        "specheads/cli.py",
        '    check_output_path(options.out, "directory")  # before the benchmark runs, not after it\n',
        "",
        (_OUT_TEST,),
    ),
    Mutation(
        "export-out-kind-ignored",
        "export checks --out as a directory for every format, also for gguf, which writes one file",
        "specheads/cli.py",
        '    check_output_path(options.out, "file" if one_file else "directory", staged=True)',
        '    check_output_path(options.out, "directory", staged=True)',
        (_OUT_TEST,),
    ),
    Mutation(
        "staged-out-parent-unchecked",
        "an existing --out is accepted without checking the parent that an export's staging folder is written in",
        "specheads/arguments.py",
        "        if not staged:\n            return out\n",
        "        return out\n",
        ("tests/test_arguments.py", _OUT_TEST),
    ),
    Mutation(
        "check-loads-despite-shared-problems",
        "export --check prints 'loads' for an engine whose own checks passed, under the shared problems it printed",
        "specheads/export/check.py",
        "            elif self.problems:\n",
        "            elif False:\n",
        (
            "tests/export/test_formats.py::"
            "test_check_gives_each_engine_one_verdict_that_agrees_with_the_shared_problems",
            "tests/methods/eagle/test_llamacpp.py::test_checking_a_file_that_is_not_gguf_gives_one_verdict",
        ),
    ),
    Mutation(
        "readme-test-command-passes-on-nothing",
        "the README's test command accepts pytest's exit code 5 (no tests collected) as a pass",
        "README.md",
        "{ SPECHEADS_REQUIRE_ALL=1 SPECHEADS_REQUIRE_SPECULATORS=1 HF_HUB_OFFLINE=1 python -m pytest -q -n 2 "
        "--dist worksteal; code=$?; "
        '[ $code -eq 5 ] && echo "pytest collected no tests: the suite is broken" >&2; [ $code -eq 0 ]; }',
        "SPECHEADS_REQUIRE_ALL=1 SPECHEADS_REQUIRE_SPECULATORS=1 HF_HUB_OFFLINE=1 python -m pytest -q -n 2 "
        "--dist worksteal || test $? -eq 5",
        ("tests/test_test_command.py",),
    ),
    Mutation(
        "namespace-package-as-dependency",
        "an optional dependency counts as installed when its import finds only a folder without code (a test folder)",
        "tests/helpers.py",
        "        if is_namespace_package(imported):\n",
        "        if getattr(imported, '__spec__', None) is None:\n",
        ("tests/test_helpers.py",),
    ),
)
