"""Prompt lookup composed with a drafter: the merged tree, the drafter's bookkeeping, the index, the sampling."""

from mutations import Mutation

LOOKUP_TESTS = "tests/inference/test_lookup.py"

MUTATIONS = (
    Mutation(
        "lookup-inner-told-every-accepted-token",
        "the wrapped drafter is told every accepted token was its own, also those only the lookup drafted",
        "specheads/inference/lookup.py",
        "            self.inner.accepted(state, inner_counts)",
        "            self.inner.accepted(state, num_accepted)",
        (f"{LOOKUP_TESTS}::test_after_lookup_only_steps_the_drafter_proposes_as_if_it_had_decoded_the_tokens_itself",),
    ),
    Mutation(
        "lookup-node-probs-from-the-drafter",
        "a lookup node reports the drafter's first node's distribution instead of a point mass on its token",
        "specheads/inference/lookup.py",
        "torch.nn.functional.one_hot(torch.tensor(tokens[old - 1]), vocab).to(inner_probs))",
        "inner_probs[0])",
        (
            f"{LOOKUP_TESTS}::test_branches_share_the_drafters_prefix_and_nodes_stay_in_depth_order",
            f"{LOOKUP_TESTS}::test_hybrid_trees_sample_the_base_distribution",
        ),
    ),
    Mutation(
        "lookup-nodes-not-in-depth-order",
        "merged nodes keep insertion order: lookup nodes after the drafter's, whatever their depth",
        "specheads/inference/lookup.py",
        "    order = sorted(range(1, len(parents)), key=lambda n: (depths[n], n))",
        "    order = list(range(1, len(parents)))",
        (f"{LOOKUP_TESTS}::test_branches_share_the_drafters_prefix_and_nodes_stay_in_depth_order",),
    ),
    Mutation(
        "lookup-oldest-occurrence-first",
        "the index proposes the oldest occurrence's continuation first, not the most recent",
        "specheads/inference/lookup.py",
        "            for end in reversed(self.ends.get(tuple(context[total - size :]), ())):",
        "            for end in self.ends.get(tuple(context[total - size :]), ()):",
        (f"{LOOKUP_TESTS}::test_the_longest_suffix_match_comes_first_most_recent_occurrence_first",),
    ),
    Mutation(
        "lookup-cache-reserves-no-extra-nodes",
        "the engine reserves cache slots for the requested tree only, not the lookup's extra branches",
        "specheads/inference/decoder.py",
        "        return tree.num_nodes + self.drafter.extra_nodes(settings.request)",
        "        return tree.num_nodes",
        (f"{LOOKUP_TESTS}::test_the_cache_reserves_the_lookups_branches_beyond_a_requested_tree",),
    ),
    Mutation(
        "idle-lookup-splits-rows",
        "a lookup that adds no node still hands the engine per-row proposals (one tree for all rows is split)",
        "specheads/inference/lookup.py",
        "        return proposals if grafted or skip else raw\n",
        "        return proposals\n",
        ("tests/inference/test_lookup.py::test_an_idle_lookup_hands_the_engine_the_drafters_own_answer",),
    ),
    Mutation(
        "skip-drafter-never",
        "skip_drafter_at is ignored: the drafter drafts on every step, however long the lookup's match",
        "specheads/inference/lookup.py",
        "        skip = self.settings.skip_drafter_at is not None and all(\n",
        "        skip = False and all(\n",
        (
            "tests/inference/test_lookup.py::test_after_lookup_only_steps_the_drafter_proposes_as_if_it_had_decoded_the_tokens_itself",
        ),
    ),
)
