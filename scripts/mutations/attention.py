"""The batch-invariant switch: the attention's scale, head grouping, masks and refusals; the linear layers' blocks."""

from mutations import Mutation

PATH = "specheads/inference/attention.py"
TESTS = "tests/inference/test_attention_properties.py"

MUTATIONS = (
    Mutation(
        "invariant-attention-default-scale",
        "the invariant attention ignores the model's `scaling` and scales scores by head_dim ** -0.5",
        PATH,
        "    scale = dim**-0.5 if scaling is None else scaling",
        "    scale = dim**-0.5",
        (TESTS,),
    ),
    Mutation(
        "invariant-attention-gqa-strided-heads",
        "grouped-query heads are paired with key-value head h % H_kv (torch.repeat's layout), not h // groups",
        PATH,
        "    q = query.reshape(batch, kv_heads, rows, dim).float()",
        "    q = query.reshape(batch, groups, kv_heads, queries, dim).transpose(1, 2)\n"
        "    q = q.reshape(batch, kv_heads, rows, dim).float()",
        (TESTS,),
    ),
    Mutation(
        "invariant-attention-tree-gather-short",
        "the tree gather keeps one visible key too few: the queries that see the most keys lose their last one",
        PATH,
        "    longest = int(counts.max())",
        "    longest = int(counts.max()) - 1",
        (TESTS,),
    ),
    Mutation(
        "invariant-attention-tree-without-gather",
        "tree nodes are computed over the buffer as it is, their visible keys among masked siblings: each sum groups "
        "a node's terms by their buffer slots, not by their places in the sequence",
        PATH,
        "    if _has_holes(allowed):",
        "    if False:",
        (
            "tests/inference/test_bf16_invariance.py::test_tree_nodes_attention_has_the_float32_bits_of_its_path_in_sequence",
        ),
    ),
    Mutation(
        "invariant-attention-causal-top-left",
        "without a mask, queries are aligned with the first keys (SDPA's is_causal), not with the last ones",
        PATH,
        "        last = torch.arange(width - queries, width, device=device)",
        "        last = torch.arange(queries, device=device)",
        (TESTS,),
    ),
    Mutation(
        "invariant-attention-ignores-position-bias",
        "the invariant attention accepts a position bias and drops it (ALiBi-style models lose their bias)",
        PATH,
        '_UNSUPPORTED = ("s_aux", "sinks", "softcap", "sliding_window", "position_bias")',
        '_UNSUPPORTED = ("s_aux", "sinks", "softcap", "sliding_window")',
        (TESTS,),
    ),
    Mutation(
        "row-blocks-skip-conv1d",
        "the switch blocks nn.Linear's rows but not transformers' Conv1D (GPT-2's projections)",
        PATH,
        "    return (torch.nn.Linear, Conv1D)",
        "    return (torch.nn.Linear,)",
        (TESTS,),
        cpu_flags=("avx512_bf16",),  # oneDNN's kernel choice depends on the row count only on such CPUs
    ),
    Mutation(
        "row-blocks-lone-row-unpadded",
        "a one-row input is computed alone (the vector-matrix kernel) instead of with a zero second row",
        PATH,
        "        if 2 <= rows.shape[0] <= MAX_PRODUCT_ROWS:",
        "        if rows.shape[0] <= MAX_PRODUCT_ROWS:",
        (TESTS,),
        cpu_flags=("avx512_bf16",),  # oneDNN's kernel choice depends on the row count only on such CPUs
    ),
    Mutation(
        "row-blocks-too-large",
        "the row block is sized for another CPU: 64 rows, past the 32 where oneDNN's bf16 kernel changes here",
        PATH,
        "MAX_PRODUCT_ROWS = 32",
        "MAX_PRODUCT_ROWS = 64",
        (TESTS,),
        cpu_flags=("amx_bf16",),  # oneDNN's kernel choice depends on the row count only on such CPUs
    ),
    Mutation(
        "row-blocks-conv1d-own-layout",
        "Conv1D is computed over its own [K, N] weight, whose kernels change from a few rows on",
        PATH,
        "    if isinstance(module, torch.nn.Linear):\n        return module.forward",
        "    if isinstance(module, _linear_types()):\n        return module.forward",
        # (on such CPUs bf16 layers run over a blocked copy of their weight; the second file checks the plain path)
        (TESTS, "tests/inference/test_blocked_weights.py"),
        cpu_flags=("amx_bf16",),  # oneDNN's kernel choice depends on the row count only on such CPUs
    ),
)
