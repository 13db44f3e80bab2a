"""Prompt lookup's optional corpus: the index, its most frequent continuation, the rule between the two sources, and
the wiring that hands the corpus to the decoder (constructor, from_pretrained, bench rows)."""

from mutations import Mutation

LOOKUP_TESTS = "tests/inference/test_lookup.py"
CLI_TESTS = "tests/test_cli_lookup.py"
LOOKUP = "specheads/inference/lookup.py"

MUTATIONS = (
    Mutation(
        "corpus-index-sorted-farthest-token-first",
        "the corpus index sorts positions by the farthest token before them first: a match is no longer one range",
        LOOKUP,
        "        order = np.lexsort(keys[::-1])",
        "        order = np.lexsort(keys)",
        (f"{LOOKUP_TESTS}::test_the_corpus_index_finds_what_enumerating_every_occurrence_finds",),
    ),
    Mutation(
        "corpus-narrow-drops-the-last-equal-entry",
        "the binary search's upper bound stops before the last occurrence of the token: one occurrence is lost",
        LOOKUP,
        "            if stream[ends[middle] - depth] <= token:",
        "            if stream[ends[middle] - depth] < token:",
        (f"{LOOKUP_TESTS}::test_the_corpus_index_finds_what_enumerating_every_occurrence_finds",),
    ),
    Mutation(
        "corpus-packed-range-one-token-too-wide",
        "a match on the packed nearest tokens takes the next token's occurrences too",
        LOOKUP,
        "                lo, hi = np.searchsorted(self._keys, [prefix << shift, (prefix + 1) << shift]).tolist()",
        "                lo, hi = np.searchsorted(self._keys, [prefix << shift, (prefix + 2) << shift]).tolist()",
        (f"{LOOKUP_TESTS}::test_the_corpus_index_finds_what_enumerating_every_occurrence_finds",),
    ),
    Mutation(
        "corpus-first-occurrence-not-most-frequent",
        "a corpus match proposes its first occurrence's continuation, not the most frequent one",
        LOOKUP,
        "                path.append(min(counts, key=lambda token: (-counts[token], token)))",
        "                path.append(next(iter(counts)))",
        (f"{LOOKUP_TESTS}::test_a_corpus_match_proposes_its_most_frequent_continuation_within_one_text",),
    ),
    Mutation(
        "corpus-wins-ties",
        "at equal match length the corpus's continuation comes before the row's own",
        LOOKUP,
        "    for size, continuation in sorted([*own, *corpus], key=lambda pair: -pair[0]):",
        "    for size, continuation in sorted([*corpus, *own], key=lambda pair: -pair[0]):",
        (f"{LOOKUP_TESTS}::test_at_equal_length_the_rows_own_continuation_comes_first",),
    ),
    Mutation(
        "corpus-never-indexed",
        "the composed drafter ignores the settings' corpus: only the row's own text is looked up",
        LOOKUP,
        "        self.corpus = corpus_index(self.settings, tokenizer)",
        "        self.corpus = None",
        (f"{LOOKUP_TESTS}::test_a_corpus_right_or_always_wrong_leaves_every_row_equal_to_plain_decoding",),
    ),
    Mutation(
        "from-pretrained-drops-the-corpus",
        "from_pretrained (generate --lookup-corpus) composes the lookup without the corpus",
        "specheads/inference/decoder.py",
        "            prompt_lookup = dataclasses.replace(lookup_settings(prompt_lookup), corpus=lookup_corpus)",
        "            prompt_lookup = lookup_settings(prompt_lookup)",
        (f"{CLI_TESTS}::test_generate_and_bench_rows_read_a_lookup_corpus",),
    ),
    Mutation(
        "bench-lookup-rows-without-the-corpus",
        "bench's +lookup rows are built without --lookup-corpus's corpus",
        "specheads/bench.py",
        "        settings = replace(settings, corpus=corpus)",
        "        settings = settings",
        (f"{CLI_TESTS}::test_generate_and_bench_rows_read_a_lookup_corpus",),
    ),
)
