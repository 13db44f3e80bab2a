"""What a new user hit: part errors, progress, flag errors, the tree list, the hub, the extras hint,
bench --methods and the scripts' --help."""

from mutations import Mutation

MUTATIONS = (
    Mutation(
        "part-without-file-plain-install",
        "a part installed without its data file is told to `pip install` again, which answers 'already satisfied'",
        "specheads/assets/__init__.py",
        "        if not path.is_file():\n            broken.append((requirement, path))\n",
        "        if not path.is_file():\n            absent.append(requirement)\n            continue\n",
        (
            "tests/assets/test_joined_bases.py::"
            "test_a_part_installed_without_its_file_names_a_forced_reinstall_of_that_package",
        ),
    ),
    Mutation(
        "generate-stats-prints-at-the-end",
        "generate --stats decodes everything before it prints a word (minutes of silence on a real base)",
        "specheads/cli.py",
        "    pieces = decoder.stream(prompt, generation_config=config)\n    out = None\n",
        "    if stats:\n"
        "        out = decoder.generate(prompt, generation_config=config)\n"
        "        print(out.text)\n"
        '        print(f"[{decoder.drafter.name}] {out.stats.summary()}", file=sys.stderr)\n'
        "        return out\n"
        "    pieces = decoder.stream(prompt, generation_config=config)\n    out = None\n",
        ("tests/test_cli.py::test_generate_shows_the_text_while_it_decodes",),
    ),
    Mutation(
        "conversion-steps-on-stdout",
        "the GGUF conversion's progress lines go to stdout, where they mix into --json and piped text",
        "specheads/gguf.py",
        '    print(f"specheads: {step}", file=sys.stderr, flush=True)',
        '    print(f"specheads: {step}", flush=True)',
        ("tests/test_gguf.py::test_a_conversion_says_each_step_on_stderr_and_a_reuse_says_nothing",),
    ),
    Mutation(
        "int-list-accepts-zero",
        "a comma-separated count list takes 0 (an off-by-one in its bound): --draft-k 0 reaches the drafter",
        "specheads/arguments.py",
        '        if value < 1:\n            raise argparse.ArgumentTypeError(f"{value} is not an integer >= 1',
        '        if value < 0:\n            raise argparse.ArgumentTypeError(f"{value} is not an integer >= 1',
        ("tests/test_arguments.py::test_a_list_of_integers_is_parsed_and_each_bad_item_is_named_with_the_form",),
    ),
    Mutation(
        "tree-forms-hard-coded",
        "the unknown-tree error lists one family's kind of grown tree (EAGLE's, the first) instead of every family's",
        "specheads/inference/trees.py",
        "        for family in tree_families()\n        for kind in family.kinds\n",
        "        for family in tree_families()[:1]\n        for kind in family.kinds\n",
        ("tests/inference/test_trees.py::test_an_unknown_tree_names_every_form_a_tree_takes",),
    ),
    Mutation(
        "hub-probe-left-to-transformers",
        "a hub id not in the cache goes to transformers unprobed: a minute of retries when the hub is unreachable",
        "specheads/loading.py",
        '        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=10)  # one request, no retries',
        "        pass  # transformers asks the hub itself",
        ("tests/test_loading.py::test_a_hub_id_the_hub_cannot_serve_fails_at_once_in_one_line",),
    ),
    Mutation(
        "checkout-looked-up-one-folder-too-deep",
        "the checkout is looked for inside the package folder (parents[0]): a checkout is told the wheel's extra",
        "specheads/extras.py",
        "    root = Path(__file__).resolve().parents[1]",
        "    root = Path(__file__).resolve().parents[0]",
        ("tests/test_extras.py::test_a_checkout_is_told_from_an_installed_wheel",),
    ),
    Mutation(
        "bench-methods-spares-heads-rows",
        "bench --methods filters every row but the --heads rows, which always run",
        "specheads/bench.py",
        'm.name == "hf-greedy" or m.exact_reference or {m.name, labels.get(m.name)} & wanted',
        'm.name == "hf-greedy" or m.exact_reference or m.name in labels or m.name in wanted',
        ("tests/test_bench.py::test_methods_keeps_the_rows_it_names_of_every_family",),
    ),
    Mutation(
        "script-help-after-heavy-imports",
        "a script reads its arguments only after importing torch: --help takes seconds",
        "scripts/bench_claims.py",
        'if __name__ == "__main__":  # --help and a usage error answer before the imports below load torch\n'
        "    parse_args()\n",
        "",
        ("tests/test_scripts_help.py",),
    ),
    Mutation(
        "bench-categories-ignored",
        "bench --categories is read but every category's prompts are kept",
        "specheads/prompts.py",
        "        prompts = [p for p in prompts if p.category in wanted]\n",
        "",
        ("tests/test_bench.py::test_categories_keep_only_the_named_ones_and_an_unknown_one_is_named",),
    ),
)
