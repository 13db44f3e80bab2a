"""A fresh audit: ten plausible bugs in parts no earlier mutation touched, written before reading the tests.

Each lists the tests a developer would expect to catch it: the test files mirroring the mutated module.
"""

from mutations import Mutation

MUTATIONS = (
    Mutation(
        "top-k-keeps-k-minus-one",
        "top-k removes the k-th most likely token too (a `<=` for `<`): k - 1 tokens are kept",
        "specheads/inference/sampling.py",
        '        logits = logits.masked_fill(logits < kth, float("-inf"))',
        '        logits = logits.masked_fill(logits <= kth, float("-inf"))',
        ("tests/inference/test_sampling.py", "tests/inference/test_sampling_invariant.py"),
    ),
    Mutation(
        "slot-write-checks-ends-only",
        "the slot cache's in-step fast path compares only the first and last rows' lengths: a ragged middle row of "
        "three is written at the first row's offset",
        "specheads/inference/kv_cache.py",
        "        if all(length == first for length in lengths):",
        "        if lengths[-1] == first:",
        ("tests/inference/test_kv_cache.py", "tests/inference/test_batched.py"),
    ),
    Mutation(
        "keep-rows-prefix-skipped",
        "keep_rows treats keeping a prefix of the rows as a no-op: the finished last rows stay in the cache's batch",
        "specheads/inference/kv_cache.py",
        "    if rows == list(range(cache.batch)):",
        "    if rows == list(range(len(rows))):",
        ("tests/inference/test_kv_cache.py", "tests/inference/test_batched.py"),
    ),
    Mutation(
        "prompt-lookup-latest-occurrence",
        "prompt lookup indexes each n-gram's latest start instead of its earliest: the context's own suffix, which "
        "has no continuation, hides every earlier match",
        "specheads/inference/drafters.py",
        "                    self.first.setdefault(tuple(context[end + 1 - size : end + 1]), end + 1 - size)",
        "                    self.first[tuple(context[end + 1 - size : end + 1])] = end + 1 - size",
        # Survived tests/inference/test_decoder.py and test_batched.py (and all of tests/inference): only the
        # property test against transformers' prompt lookup catches it.
        (
            "tests/inference/test_prompt_lookup_properties.py",
            "tests/inference/test_decoder.py",
            "tests/inference/test_batched.py",
        ),
    ),
    Mutation(
        "draft-rollback-counts-unfed-draft",
        "the draft model's rollback counts its last draft as cached, though it was never fed: the draft skips "
        "feeding one accepted token",
        "specheads/inference/drafters.py",
        "            cached + min(accepted, max(drafted - 1, 0))",
        "            cached + min(accepted, drafted)",
        (
            "tests/inference/test_decoder.py",
            "tests/inference/test_batched.py",
            "tests/methods/draft_lm/test_draft_lm.py",
        ),
    ),
    Mutation(
        "tree-choices-lexicographic",
        "Medusa choice lists sorted lexicographically instead of by (depth, path): nodes no longer listed by depth",
        "specheads/inference/trees.py",
        "    return tuple(sorted(paths, key=lambda p: (len(p), p)))",
        "    return tuple(sorted(paths))",
        ("tests/inference/test_trees.py", "tests/methods/medusa/test_medusa_drafter.py"),
    ),
    Mutation(
        "ddtree-sibling-score-unreplaced",
        "DDTree scores a node's next sibling as the path plus the sibling, without removing the replaced one",
        "specheads/methods/dflash/drafter.py",
        "(-(score - values[rank] + values[rank + 1]), counter, parent, level, rank + 1)",
        "(-(score + values[rank + 1]), counter, parent, level, rank + 1)",
        ("tests/methods/dflash/test_dflash_drafter.py",),
    ),
    Mutation(
        "checkpoint-names-unpadded",
        "checkpoint folders named step-N without zero padding: step-10 sorts before step-9 (resume, keep_last)",
        "specheads/training/checkpoints.py",
        '    final, temporary = root / f"step-{run.step:08d}"',
        '    final, temporary = root / f"step-{run.step}"',
        ("tests/training/test_trainer.py",),
    ),
    Mutation(
        "select-best-keeps-lowest",
        "output.select=best keeps the heads with the lowest simulated tau (compared as a loss)",
        "specheads/training/heldout.py",
        "    return not best.is_file() or _score(run, record) > _score(run, json.loads(best.read_text()))",
        "    return not best.is_file() or _score(run, record) < _score(run, json.loads(best.read_text()))",
        ("tests/training/test_trainer.py",),
    ),
    Mutation(
        "chat-rendering-adds-bos",
        "a chat-template rendering is tokenised with the tokenizer's special tokens: a second BOS after the "
        "template's own",
        "specheads/prompts.py",
        '    return list(tokenizer(text, add_special_tokens=False)["input_ids"])',
        '    return list(tokenizer(text, add_special_tokens=True)["input_ids"])',
        ("tests/test_prompts.py", "tests/inference/test_chat.py"),
    ),
)
