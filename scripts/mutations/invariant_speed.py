"""The invariant attention's weighted sum at a real head size (key blocks, the fold) and the stacked prefill."""

from mutations import Mutation

PATH = "specheads/inference/attention.py"
TESTS = "tests/inference/test_attention_widths.py"

MUTATIONS = (
    Mutation(
        "weighted-sum-in-model-dtype-over-the-width",
        "the weighted sum of values is one bf16 product over the whole (padded) width, as transformers' eager "
        "attention computes it, instead of 64-key float32 blocks",
        PATH,
        "    return _fold(_block_products(weights, values))",
        "    return torch.matmul(weights.to(value.dtype), values.to(value.dtype)).float()",
        (TESTS,),
        cpu_flags=("amx_bf16",),  # oneDNN's bf16 kernels group the terms by the width on such CPUs (measured)
    ),
    Mutation(
        "tree-tail-not-block-aligned",
        "a tree node takes its whole run of leading slots from the buffer, not whole key blocks of it: the rest of "
        "its keys start in the middle of a block",
        PATH,
        "    buffered = leading // KEY_BLOCK * KEY_BLOCK  # [B, Q]: its whole key blocks in that run",
        "    buffered = leading  # [B, Q]: its whole key blocks in that run",
        (TESTS,),
    ),
    Mutation(
        "padded-keys-scored-zero",
        "the scores are padded to whole key blocks with zeros, not -inf: the padding places get weight",
        PATH,
        '        scores = F.pad(scores, (0, plan.width - width), value=float("-inf"))',
        "        scores = F.pad(scores, (0, plan.width - width))",
        (TESTS,),
    ),
    Mutation(
        "fold-by-the-sum-kernel",
        "the one-pass fold adds the blocks with torch's float32 sum (its own grouping) instead of in order",
        PATH,
        "        return blocks.cumsum(dim=-3).select(-3, -1)  # (a CPU's cumulative sum of float32 runs in float64)",
        "        return blocks.sum(dim=-3)",
        (TESTS,),
    ),
    Mutation(
        "stacked-rows-at-the-longest-length",
        "a batch's cache stacked from its prompts' caches gives every row the longest prompt's length (as one padded "
        "batched prefill did), so a shorter row's step sees slots after its prompt",
        "specheads/inference/kv_cache.py",
        "    cache.lengths = [row.lengths[0] for row in rows]",
        "    cache.lengths = [max(row.lengths[0] for row in rows)] * len(rows)",
        (
            "tests/inference/test_kv_cache.py::test_stacked_rows_hold_each_prompt_alone_and_a_step_reads_them_as_the_row_alone",
        ),
    ),
)
