"""Recipe v2 for EAGLE-3: the draft vocabulary by coverage, EAGLE 3.1's norms and their exports, Muon,
warmup-stable-decay, the training-time-test length, and the stratified held-out diagnostics."""

from mutations import Mutation

NORMS = "tests/methods/eagle/test_eagle31_norms.py"
FOLD = "tests/methods/eagle/test_eagle31_fold.py"
SETTINGS = "tests/methods/eagle/test_eagle_recipe_settings.py"
OPTIMIZERS = "tests/training/test_optimizers.py"
DIAGNOSTICS = "tests/training/test_diagnostics.py"
CONSUMER = "tests/methods/eagle/test_speculators_consumer.py::test_speculators_runs_eagle31_norms_as_specheads_does"
SPECULATORS = (("SPECHEADS_REQUIRE_SPECULATORS", "1"),)

MUTATIONS = (
    Mutation(
        "fc-norm-after-fc",
        "EAGLE 3.1's fc_norm normalises fc's output instead of each fused layer before fc",
        "specheads/methods/eagle/heads.py",
        "        if self.fc_norm is not None:\n"
        "            features = [norm(f) for norm, f in zip(self.fc_norm, features, strict=True)]\n"
        "        fused = torch.cat(features, dim=-1)\n",
        "        fused = torch.cat(features, dim=-1)\n"
        "        if self.fc_norm is not None:\n"
        "            return self.fc_norm[0](self.fc(fused))\n",
        (f"{NORMS}::test_fc_norm_normalises_each_fused_layer_before_fc", CONSUMER),
        SPECULATORS,
    ),
    Mutation(
        "norm-output-normed-twice",
        "with norm_output the lm_head reads norm(norm(output)): the step's normed state is normed again",
        "specheads/methods/eagle/heads.py",
        "        return hidden if self.config.norm_output else self.norm(hidden)\n",
        "        return self.norm(hidden)\n",
        (f"{NORMS}::test_norm_output_feeds_the_normed_state_forward", CONSUMER),
        SPECULATORS,
    ),
    Mutation(
        "export-fc-norm-unpermuted",
        "the engine layouts sort the fused layers and fc's blocks but leave fc_norm.k in training order",
        "specheads/methods/eagle/export.py",
        '        state.update({f"fc_norm.{k}.weight": norms[i] for k, i in enumerate(order)})\n',
        '        state.update({f"fc_norm.{k}.weight": norms[k] for k, i in enumerate(order)})\n',
        (f"{NORMS}::test_the_engine_layouts_carry_the_norms_and_read_back_the_same_drafts", CONSUMER),
        SPECULATORS,
    ),
    Mutation(
        "speculators-norm-output-unwritten",
        "the speculators export writes norm_output false whatever the heads do",
        "specheads/methods/eagle/export.py",
        '        "norm_output": head.config.norm_output,\n',
        '        "norm_output": False,\n',
        (f"{NORMS}::test_the_engine_layouts_carry_the_norms_and_read_back_the_same_drafts", CONSUMER),
        SPECULATORS,
    ),
    Mutation(
        "coverage-one-id-short",
        "the draft vocabulary chosen by coverage has one id too few (the index of the covering id, not a count)",
        "specheads/heads/vocab.py",
        "    return min(first + 1, counts.numel())\n",
        "    return max(min(first, counts.numel()), 1)\n",
        ("tests/heads/test_vocab.py", f"{SETTINGS}::test_a_coverage_picks_the_smallest_vocabulary_and_says_so"),
    ),
    Mutation(
        "muon-takes-vectors",
        "Muon's split sends 1-D parameters (norms, biases) to Muon with the matrices",
        "specheads/training/optimizers.py",
        "hidden_matrix = parameter.ndim == 2 and min(parameter.shape) > 1 and id(parameter)",
        "hidden_matrix = parameter.ndim >= 1 and id(parameter)",
        (OPTIMIZERS,),
    ),
    Mutation(
        "muon-lr-multiplier-ignored",
        "Muon runs at train.lr instead of train.muon_lr_multiplier x train.lr",
        "specheads/training/optimizers.py",
        "        muon_lr=train.lr * train.muon_lr_multiplier,\n",
        "        muon_lr=train.lr,\n",
        (f"{OPTIMIZERS}::test_two_steps_match_hand_written_muon_and_adamw",),
    ),
    Mutation(
        "muon-groups-unlinked-after-load",
        "after a state is loaded (Accelerate's prepare) the schedule sets the lr of stale groups, not the optimizers'",
        "specheads/training/optimizers.py",
        "            part.load_state_dict(state)\n        self._link_groups()\n",
        "            part.load_state_dict(state)\n",
        (f"{OPTIMIZERS}::test_the_schedule_reaches_both_optimizers_even_after_a_state_is_loaded",),
    ),
    Mutation(
        "wsd-decays-from-the-start",
        "warmup-stable-decay decays over every step after the warmup: no stable phase at the peak",
        "specheads/training/optimizers.py",
        "    decay_steps = round(train.decay_fraction * total_steps)\n",
        "    decay_steps = total_steps - train.warmup_steps\n",
        (f"{OPTIMIZERS}::test_warmup_stable_decay_by_hand",),
    ),
    Mutation(
        "ttt-length-fixed",
        "the EAGLE-3 train step unrolls a fixed 4 steps whatever heads.ttt_steps says",
        "specheads/methods/eagle/train.py",
        "    steps = 1 if head.config.version == 1 else section.ttt_steps\n",
        "    steps = 1 if head.config.version == 1 else 4\n",
        (f"{SETTINGS}::test_the_ttt_length_is_honoured",),
    ),
    Mutation(
        "init-from-without-defaults",
        "train.init_from compares a checkpoint's config as written: heads saved before a setting existed are refused",
        "specheads/training/trainer.py",
        "        recorded = {**{f.name: f.default for f in settings if f.default is not dataclasses.MISSING}, "
        "**recorded}\n",
        "",
        (f"{SETTINGS}::test_heads_saved_before_the_norms_existed_continue",),
    ),
    Mutation(
        "strata-copy-against-the-data",
        "a position counts as copy when the n-gram rule predicts the data's token, not the base's",
        "specheads/training/diagnostics.py",
        '"copy" if continuations[row][target] == wanted else "novel"',
        '"copy" if continuations[row][target] == int(input_ids[row, target]) else "novel"',
        (f"{DIAGNOSTICS}::test_positions_fall_into_their_groups",),
    ),
    Mutation(
        "strata-confidence-off-by-one",
        "the base's confidence is read at the target position instead of the one that predicts it",
        "specheads/training/diagnostics.py",
        "                confidence = float(p_top1[row, target - 1])",
        "                confidence = float(p_top1[row, min(target, p_top1.shape[1] - 1)])",
        (f"{DIAGNOSTICS}::test_positions_fall_into_their_groups",),
    ),
    Mutation(
        "strata-ngram-reads-the-prompt",
        "the copy split looks n-grams up in the prompt as well as the answer (the answer's start is not passed)",
        "specheads/training/diagnostics.py",
        "            continuations.append(ngram_continuations(input_ids[row].tolist(), start))\n",
        "            continuations.append(ngram_continuations(input_ids[row].tolist()))\n",
        (f"{DIAGNOSTICS}::test_an_ngram_of_the_prompt_is_not_a_copy",),
    ),
    Mutation(
        "bootstrap-unpaired",
        "the bootstrap resamples the second head's rows independently of the first's (an unpaired interval)",
        "specheads/training/diagnostics.py",
        "    differences = (hits_b[picks].sum(dim=1) - hits_a[picks].sum(dim=1)) / counts\n",
        "    differences = (hits_b[picks.flip(0)].sum(dim=1) - hits_a[picks].sum(dim=1)) / counts\n",
        (f"{DIAGNOSTICS}::test_a_constant_difference_per_row_has_no_spread",),
    ),
    Mutation(
        "strata-depth-off-path",
        "deeper depths are scored where the draft's path above them left the base's (no on-path condition)",
        "specheads/training/diagnostics.py",
        "        on_path[:, :count] &= input_ids[:, 2 + step :] == wanted  # the next depth is fed the data's token\n",
        "",
        (f"{DIAGNOSTICS}::test_each_depth_scores_the_positions_on_the_base_path",),
    ),
    Mutation(
        "training-memory-threshold-not-set",
        "the allocator's thresholds are reported set but are not: a long run's freed blocks stay with the process",
        "specheads/training/memory.py",
        "    applied = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1\n",
        "    return True\n",
        ("tests/training/test_memory.py::test_freed_blocks_go_back_to_the_system_where_glibc_keeps_them_by_default",),
    ),
    Mutation(
        "trainer-keeps-freed-memory",
        "the trainer never asks glibc to return freed blocks: its memory grows with every step of a long run",
        "specheads/training/trainer.py",
        "    return_freed_memory()  # a long run's freed blocks go back to the system (glibc): its memory stays flat\n",
        "",
        ("tests/training/test_memory.py::test_the_trainer_applies_it_before_a_run_starts",),
    ),
    Mutation(
        "shipped-command-drops-overrides",
        "a shipped manifest's train command leaves out the settings the run took from its command line",
        "scripts/ship_named_heads.py",
        '    train = " ".join([f"specheads train --config {config}", *overrides])\n',
        '    train = f"specheads train --config {config}"\n',
        (
            "tests/assets/test_ship_named_heads_script.py::"
            "test_settings_the_run_took_from_its_command_line_are_repeated_on_its_train_command",
        ),
    ),
    Mutation(
        "shipped-overrides-include-paths",
        "where the run wrote its files (output.dir, the feature cache) is recorded as a setting of the heads",
        "scripts/ship_named_heads.py",
        "        if key not in NEUTRAL_SETTINGS and key in written and written[key] != value\n",
        "        if key in written and written[key] != value\n",
        (
            "tests/assets/test_ship_named_heads_script.py::"
            "test_settings_the_run_took_from_its_command_line_are_repeated_on_its_train_command",
        ),
    ),
    Mutation(
        "heads-variant-ignored",
        "heads='default:llamacpp' loads the default heads: the variant after the colon is dropped",
        "specheads/heads/loading.py",
        '        variant = heads.partition(":")[2] or None\n',
        "        variant = None\n",
        (
            "tests/assets/test_shipped_variants.py::"
            "test_a_variant_is_named_default_colon_variant_and_the_default_stays_the_default",
        ),
    ),
    Mutation(
        "llamacpp-checks-use-the-default",
        "llama.cpp's checks and exports take the default heads even where a llamacpp variant is shipped",
        "specheads/assets/__init__.py",
        "    return shipped_heads(base, LLAMACPP_VARIANT if LLAMACPP_VARIANT in heads_variants(base) else None)\n",
        "    return shipped_heads(base)\n",
        (
            "tests/assets/test_shipped_variants.py::"
            "test_a_variant_is_named_default_colon_variant_and_the_default_stays_the_default",
        ),
    ),
    Mutation(
        "norm-before-fc-skipped",
        "norm_before_fc heads fuse the raw concatenated features: input_norm is never applied",
        "specheads/methods/eagle/heads.py",
        "        return self.fc(fused if self.input_norm is None else self.input_norm(fused))\n",
        "        return self.fc(fused)\n",
        (f"{NORMS}::test_norm_before_fc_normalises_the_concatenated_features_once_before_fc",),
    ),
    Mutation(
        "export-input-norm-unpermuted",
        "the engine layouts sort the fused layers and fc's blocks but leave input_norm's blocks in training order",
        "specheads/methods/eagle/export.py",
        '        state["input_norm.weight"] = torch.cat([scales[i] for i in order])\n',
        '        state["input_norm.weight"] = torch.cat(list(scales))\n',
        (f"{NORMS}::test_the_engine_layouts_carry_the_norms_and_read_back_the_same_drafts",),
    ),
    Mutation(
        "speculators-norm-before-fc-dropped",
        "the speculators export writes norm_before_fc false whatever the heads: speculators skips the input norm",
        "specheads/methods/eagle/export.py",
        '        "norm_before_fc": head.config.norm_before_fc,\n',
        '        "norm_before_fc": False,\n',
        (f"{NORMS}::test_the_engine_layouts_carry_the_norms_and_read_back_the_same_drafts",),
    ),
    Mutation(
        "gguf-check-ignores-input-norm",
        "the GGUF checker passes a draft whose norm_before_fc key and input norm tensor disagree",
        "specheads/methods/eagle/gguf.py",
        '    if bool(fields.get(f"{ARCH}.norm_before_fc", False)) != (input_norm in shape):\n',
        "    if False:\n",
        ("tests/methods/eagle/test_llamacpp.py::test_the_checker_wants_norm_before_fc_and_its_norm_together",),
    ),
    Mutation(
        "shipped-code-files-ignore-the-limit",
        "heads trained on the first data.limit source files ship a listing of every training file of the corpus",
        "scripts/ship_named_heads.py",
        '        files = corpus.split_files("train")[: config.limit] + corpus.split_files("heldout")\n',
        '        files = corpus.split_files("train") + corpus.split_files("heldout")\n',
        (
            "tests/assets/test_ship_named_heads_script.py::test_code_heads_ship_the_files_they_trained_on_with_their_hashes",
        ),
    ),
    Mutation(
        "calibration-options-lose-a-size",
        "the calibrate arguments read back from tree.json leave out the tokens decoded per timed prompt",
        "specheads/heads/calibration.py",
        '        for name in ("threads", "batches", "max_nodes", "prompt_tokens", "new_tokens")\n',
        '        for name in ("threads", "batches", "max_nodes", "prompt_tokens")\n',
        (
            "tests/test_calibrate_choice.py::"
            "test_the_record_keeps_the_fastest_measured_trees_not_the_modelled_or_the_largest",
        ),
    ),
    Mutation(
        "fold-without-block-ratios",
        "the llama.cpp fold copies each fc_norm into input_norm without the block's rms ratio",
        "specheads/methods/eagle/fold.py",
        '    blocks = [state.pop(f"fc_norm.{k}.weight").float() * ratio'
        " for k, ratio in enumerate(statistics.block_ratios)]\n",
        '    blocks = [state.pop(f"fc_norm.{k}.weight").float() for k, ratio in enumerate(statistics.block_ratios)]\n',
        (f"{FOLD}::test_the_folded_fuse_equals_the_heads_where_block_ratios_hold",),
    ),
    Mutation(
        "fold-attention-not-rescaled",
        "the llama.cpp fold scales the normed residual by kappa but leaves the q/k/v columns that read it",
        "specheads/methods/eagle/fold.py",
        "        weight[:, hidden:] /= kappa\n",
        "        weight[:, hidden:] /= 1.0\n",
        (f"{FOLD}::test_the_first_draft_step_is_exact_where_its_input_has_rms_kappa",),
    ),
    Mutation(
        "gguf-target-architecture-unchecked",
        "a draft checked against a qwen2 target passes, though the pinned llama-server aborts with it",
        "specheads/methods/eagle/gguf.py",
        "    if target.architecture is None or target.architecture in EAGLE3_TARGET_ARCHITECTURES:\n",
        "    if True:\n",
        ("tests/methods/eagle/test_llamacpp.py::test_a_target_whose_graph_hands_eagle3_no_layer_inputs_is_named",),
    ),
    Mutation(
        "fold-statistics-mean-square",
        "the fold's block ratios compare mean squares, not rms: each ratio is squared",
        "specheads/methods/eagle/fold.py",
        "    rms = torch.stack([b.pow(2).mean(-1).sqrt() for b in blocks], dim=-1)  # [N, K]\n",
        "    rms = torch.stack([b.pow(2).mean(-1) for b in blocks], dim=-1)  # [N, K]\n",
        (f"{FOLD}::test_the_statistics_are_the_rms_ratios_of_the_blocks_and_the_median_rms_of_fc",),
    ),
)
