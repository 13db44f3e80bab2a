"""The switch's linear layers over a blocked copy of their weights: the layout, the copy's freshness, autograd."""

from mutations import Mutation

PATH = "specheads/inference/attention.py"
TESTS = "tests/inference/test_blocked_weights.py"

MUTATIONS = (
    Mutation(
        "blocked-layout-for-one-row",
        "the blocked copy of a weight is laid out for one-row products, whose layout rounds 2-row products over an "
        "8,960-wide inner size differently from the plain product",
        PATH,
        "_PACKED_FOR_ROWS = 2",
        "_PACKED_FOR_ROWS = 1",
        (TESTS,),
        cpu_flags=("amx_bf16",),  # the blocked copy is used on CPUs with AMX only
    ),
    Mutation(
        "blocked-weight-never-refreshed",
        "a weight's blocked copy is kept after the weight changed (a fine-tuned or reloaded base decodes with the old "
        "weights)",
        PATH,
        "    if cached is None or cached[0] != stamp:",
        "    if cached is None:",
        (f"{TESTS}::test_a_changed_weight_is_copied_again",),
        cpu_flags=("amx_bf16",),
    ),
    Mutation(
        "blocked-product-under-autograd",
        "the blocked product also runs while autograd records (it has no derivative: the weights get no gradient)",
        PATH,
        "        if torch.is_grad_enabled():\n            return forward(x) if forward is not None",
        "        if False:\n            return forward(x) if forward is not None",
        (f"{TESTS}::test_with_autograd_recording_the_plain_product_runs_and_gradients_flow",),
        cpu_flags=("amx_bf16",),
    ),
)
