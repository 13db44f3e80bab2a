"""Gradient accumulation in the trainer (optimizer steps, loss weighting, epoch ends, resume position) and per-row
budgets cutting a grown tree in a batch."""

from mutations import Mutation

ACCUMULATION = "tests/training/test_accumulation.py"
BUDGETS = "tests/inference/test_tree_budgets.py"

MUTATIONS = (
    Mutation(
        "accumulation-steps-every-micro-batch",
        "the torch optimizer is stepped directly: it steps after every micro-batch, not once per accumulation",
        "specheads/training/trainer.py",
        "    run.optimizer.step()  # the prepared optimizer skips the step while gradients accumulate",
        "    run.optimizer.optimizer.step()  # the prepared optimizer skips the step while gradients accumulate",
        (f"{ACCUMULATION}::test_two_epochs_see_every_row_once_per_epoch_and_step_after_each_pair_and_each_epochs_end",),
    ),
    Mutation(
        "accumulation-loss-divided-twice",
        "each micro-batch's loss is divided by grad_accumulation before Accelerate's backward divides it again",
        "specheads/training/trainer.py",
        "    run.accelerator.backward(loss)\n",
        "    run.accelerator.backward(loss / run.config.train.grad_accumulation)\n",
        (f"{ACCUMULATION}::test_a_step_follows_the_gradient_of_the_mean_over_its_micro_batches_targets",),
    ),
    Mutation(
        "accumulation-epoch-leftover-uncounted",
        "the run's length ignores the step an epoch's left-over micro-batches make: the last epoch ends early",
        "specheads/training/trainer.py",
        "    steps_per_epoch = math.ceil(batches_per_epoch / config.train.grad_accumulation)",
        "    steps_per_epoch = batches_per_epoch / config.train.grad_accumulation",
        (f"{ACCUMULATION}::test_two_epochs_see_every_row_once_per_epoch_and_step_after_each_pair_and_each_epochs_end",),
    ),
    Mutation(
        "resume-position-in-steps",
        "resume places the data loader at steps x grad_accumulation micro-batches, not at the micro-batches seen",
        "specheads/training/checkpoints.py",
        '    run.step, run.batches_seen = state["step"], state["batches_seen"]',
        '    run.step, run.batches_seen = state["step"], state["step"] * run.config.train.grad_accumulation',
        (f"{ACCUMULATION}::test_a_run_stopped_mid_epoch_resumes_to_the_same_micro_batches_and_weights",),
    ),
    Mutation(
        "budget-cut-one-level-deep",
        "a row's tree is cut one level below its depth limit: it verifies nodes its budget cannot take",
        "specheads/inference/packing.py",
        "    tree = proposal.tree.truncated(max_depth)",
        "    tree = proposal.tree.truncated(max_depth + 1)",
        (BUDGETS,),
    ),
    Mutation(
        "budget-tightest-row-for-all",
        "every row's tree is cut to the tightest row's depth limit, not to its own",
        "specheads/inference/packing.py",
        "    return [truncated(p, limit) for p, limit in zip(rows_of(proposal, batch), limits, strict=True)]",
        "    return [truncated(p, min(limits)) for p in rows_of(proposal, batch)]",
        (BUDGETS,),
    ),
    Mutation(
        "budget-forgets-the-bonus-token",
        "a row's depth limit is its tokens left, forgetting that one of them is the base's own",
        "specheads/inference/decoder.py",
        "        return max(remaining - 1, 0)",
        "        return max(remaining, 0)",
        (f"{BUDGETS}::test_rows_with_different_budgets_cut_their_own_trees_and_decode_as_greedy_alone",),
    ),
)
