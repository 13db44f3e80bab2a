"""One view of the base for training: the cached teacher applies the base's own logit transform (or refuses the
base), EAGLE's logging step projects the base's logits a chunk at a time, and gradient accumulation weighs targets,
not micro-batches."""

from mutations import Mutation

FEATURES = "tests/training/test_features.py"
CACHED_TEACHER = f"{FEATURES}::test_the_cached_teacher_applies_the_bases_logit_transform_and_trains_as_the_online_one"
REFUSED = f"{FEATURES}::test_a_base_whose_logit_transform_the_cache_cannot_reproduce_is_refused"
LOGGING_PEAK = (
    "tests/methods/eagle/test_eagle_trainer.py::"
    "test_a_logging_step_at_a_real_vocabulary_allocates_no_more_than_a_plain_step_plus_one_chunk"
)
TEACHER_STEP = (
    "tests/methods/test_training_teacher.py::test_a_methods_logging_step_reads_no_whole_logits_and_loses_nothing_by_it"
)
LOGGING_STEP = (
    "tests/methods/eagle/test_eagle_trainer.py"
    "::test_a_logging_step_projects_the_bases_logits_a_chunk_at_a_time_and_changes_no_loss"
)
ACCUMULATION = "tests/training/test_accumulation.py"
TARGETS_STEP = f"{ACCUMULATION}::test_micro_batches_of_10_and_100_targets_step_with_the_gradient_of_their_110"
MEAN_STEP = f"{ACCUMULATION}::test_a_step_follows_the_gradient_of_the_mean_over_its_micro_batches_targets"

MUTATIONS = (
    Mutation(
        "cached-teacher-skips-logit-transform",
        "the cached teacher's logits are the lm_head's alone: a soft-capped or scaled base's transform is skipped",
        "specheads/training/features.py",
        "                self._logits = logits if self._transform is None else self._transform(logits)\n",
        "                self._logits = logits\n",
        (CACHED_TEACHER,),
    ),
    Mutation(
        "cache-written-for-an-unreproducible-base",
        "the feature cache is written for a base whose logit transform it cannot reproduce (refused only on reading)",
        "specheads/training/features.py",
        "    logit_transform(base)  # refused before the base runs over the data, not when training reads the cache\n",
        "",
        (REFUSED,),
    ),
    Mutation(
        "cache-trusts-any-model-type",
        "the cached teacher applies a known transform field to any model type (a Llama saying it soft-caps)",
        "specheads/training/features.py",
        "    if others or model_type not in types:\n",
        "    if others or transform is None:\n",
        (REFUSED,),
    ),
    Mutation(
        "eagle-logging-step-full-teacher",
        "EAGLE's logging step builds the base's whole [B, T, V] logits to take their argmax",
        "specheads/methods/eagle/train.py",
        "        greedy = view.greedy()  # [B, T]\n",
        "        greedy = view.teacher().argmax(dim=-1)  # [B, T]\n",
        (LOGGING_STEP,),
    ),
    Mutation(
        "eagle-logging-step-full-teacher-measured",
        "EAGLE's logging step builds the base's whole [B, T, V] logits to take their argmax (seen by the memory)",
        "specheads/methods/eagle/train.py",
        "        greedy = view.greedy()  # [B, T]\n",
        "        greedy = view.teacher().argmax(dim=-1)  # [B, T]\n",
        (LOGGING_PEAK,),
    ),
    Mutation(
        "draft-lm-whole-teacher",
        "draft-LM's step asks the base's forward for its whole [B, T, V] logits again",
        "specheads/methods/draft_lm/train.py",
        "    _, view = context.base_features(batch, (), full_logits=False)\n",
        "    _, view = context.base_features(batch, (), logits_to_keep=0)\n",
        (TEACHER_STEP,),
    ),
    Mutation(
        "teacher-at-wrong-state",
        "the teacher at the scored positions is projected from the layer before the final norm, not the final state",
        "specheads/training/features.py",
        "        return head(self.final[batch_index, positions].to(head.weight.dtype))\n",
        "        return head(self.hidden(-2)[batch_index, positions].to(head.weight.dtype))\n",
        (TEACHER_STEP,),
    ),
    Mutation(
        "projected-teacher-ignores-columns",
        "a projected teacher restricted to a draft vocabulary projects every column (the columns are dropped)",
        "specheads/training/losses.py",
        "            self.projection = (weight[self.columns], None if bias is None else bias[self.columns])\n",
        "",
        ("tests/methods/test_training_teacher.py::test_a_projected_teacher_equals_the_teacher_of_the_whole_logits",),
    ),
    Mutation(
        "accumulation-weighs-micro-batches",
        "gradient accumulation weighs every micro-batch alike, whatever its targets",
        "specheads/training/trainer.py",
        "    weight = float(weight)\n",
        "    weight = 1.0\n",
        (TARGETS_STEP,),
    ),
    Mutation(
        "accumulation-ignores-the-methods-weight",
        "gradient accumulation weighs a micro-batch by its next-token targets, not by what the method's loss averages",
        "specheads/training/trainer.py",
        "    weight = result.weight\n",
        "    weight = None\n",
        (TARGETS_STEP,),
    ),
    Mutation(
        "accumulation-forgets-accelerates-division",
        "the weighted gradients are divided by the step's targets alone, still divided by N by Accelerate's backward",
        "specheads/training/trainer.py",
        "        scale = accelerator.gradient_accumulation_steps * accelerator.num_processes / float(total)\n",
        "        scale = accelerator.num_processes / float(total)\n",
        (TARGETS_STEP, MEAN_STEP),
    ),
)
