"""Prompt lookup's wiring: the +lookup bench rows and their filter, the --prompt-lookup options, the calibrated split
(the choice rule, its threshold, the record's key and its reading back)."""

from mutations import Mutation

CALIBRATE_TESTS = "tests/test_calibrate_lookup.py"
CLI_TESTS = "tests/test_cli_lookup.py"

MUTATIONS = (
    Mutation(
        "bench-lookup-rows-under-the-plain-label",
        "a heads label's +lookup rows are filed under the plain label: --methods eagle+lookup keeps none of them",
        "specheads/bench.py",
        '                labels[methods[-1].name] = f"{label}+lookup"',
        "                labels[methods[-1].name] = label",
        (f"{CLI_TESTS}::test_bench_adds_a_lookup_row_next_to_each_specheads_row_and_methods_names_them",),
    ),
    Mutation(
        "bench-lookup-names-not-implied",
        "bench --methods naming a +lookup row without --prompt-lookup builds no lookup rows (an unknown method)",
        "specheads/bench.py",
        '    with_lookup = options.lookup.prompt_lookup or any("+lookup" in name for name in only or ())',
        "    with_lookup = options.lookup.prompt_lookup",
        (f"{CLI_TESTS}::test_bench_lookup_rows_are_exact_and_report_their_spread_as_none_does",),
    ),
    Mutation(
        "generate-drops-prompt-lookup",
        "generate --prompt-lookup is parsed but not handed to the decoder",
        "specheads/options.py",
        '            "prompt_lookup": self.lookup.prompt_lookup,\n',
        "",
        (CLI_TESTS,),
    ),
    Mutation(
        "calibrate-lookup-wrong-key",
        "calibrate --prompt-lookup writes the split under a key the loader does not read",
        "specheads/calibrate.py",
        '        record["lookup"] = calibrate_lookup(',
        '        record["prompt_lookup"] = calibrate_lookup(',
        (f"{CALIBRATE_TESTS}::test_calibrate_prompt_lookup_stores_the_split_that_generate_reads",),
    ),
    Mutation(
        "calibration-ignores-lookup",
        "loading tree.json drops the record's lookup split: prompt_lookup=True always takes the defaults",
        "specheads/heads/calibration.py",
        '            lookup=dict(record["lookup"]) if record.get("lookup") else None,',
        "            lookup=None,",
        (CALIBRATE_TESTS,),
    ),
    Mutation(
        "calibrated-lookup-eagle-attribute-only",
        "the calibrated split is looked for on the drafter's `head` only: Medusa's drafter (`heads`) never finds it",
        "specheads/inference/construction.py",
        '    heads = next((getattr(drafter, name) for name in ("head", "heads") if hasattr(drafter, name)), None)',
        '    heads = getattr(drafter, "head", None)',
        (f"{CALIBRATE_TESTS}::test_from_pretrained_composes_the_stored_split_and_the_defaults_without_one",),
    ),
    Mutation(
        "lookup-choice-keeps-the-failing-depth",
        "the choice rule counts a depth before testing it: each branch keeps one token below the threshold",
        "specheads/calibrate.py",
        "            if acceptance <= 0 or acceptance < threshold:\n                break\n            length += 1\n",
        "            length += 1\n            if acceptance <= 0 or acceptance < threshold:\n                break\n",
        (CALIBRATE_TESTS,),
    ),
    Mutation(
        "lookup-threshold-inverted-tau",
        "the threshold divides by tau instead of multiplying: long trees keep lookup tokens that do not pay",
        "specheads/calibrate.py",
        "    return max(0.0, tau * marginal / step_time_ms)",
        "    return max(0.0, marginal / (tau * step_time_ms))",
        (f"{CALIBRATE_TESTS}::test_the_threshold_is_tau_times_the_marginal_node_cost_over_the_step",),
    ),
    Mutation(
        "lookup-last-stats-stale",
        "WithLookup.last_stats is not the generation's: calibrate measures nothing and keeps the defaults",
        "specheads/inference/lookup.py",
        "        self.last_stats = state.draft.stats\n",
        "",
        (f"{CALIBRATE_TESTS}::test_calibrate_prompt_lookup_stores_the_split_that_generate_reads",),
    ),
    Mutation(
        "bench-skip-row-does-not-skip",
        "bench's +lookup-skip row keeps the lookup's settings: its draft model drafts on every step",
        "specheads/bench.py",
        "        settings = replace(settings, skip_drafter_at=max(skip_drafter_at, settings.min_ngram))\n",
        "",
        (
            "tests/test_cli_lookup.py::test_bench_skip_drafter_at_adds_a_skipping_sibling_to_each_draft_model_lookup_row",
        ),
    ),
)
