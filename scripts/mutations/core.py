"""The first mutations: acceptance, sampling, resume, export, the feature cache, the train steps, the leak check."""

from mutations import Mutation

MUTATIONS = (
    Mutation(
        "greedy-extra-token",
        "greedy acceptance takes one more draft token (the node's first child) after a partial accept",
        "specheads/inference/acceptance.py",
        "            return AcceptResult(path, wanted, [node_tokens[c] for c in path])",
        "            if children and children[node] and path:\n"
        "                path.append(children[node][0])\n"
        "            return AcceptResult(path, wanted, [node_tokens[c] for c in path])",
        ("tests/inference/test_decoder.py",),
    ),
    Mutation(
        "tree-residual-unnormalised",
        "tree rejection sampling: the residual is not renormalised after a rejected sibling",
        "specheads/inference/acceptance.py",
        "            residual = residual / total if total > 0 else p[node]",
        "            residual = residual if total > 0 else p[node]",
        ("tests/inference/test_acceptance.py", "tests/inference/test_sampling_invariant.py"),
    ),
    Mutation(
        "resume-drops-optimizer-state",
        "resume: one parameter's AdamW state is dropped after loading the checkpoint",
        "specheads/training/checkpoints.py",
        "    run.accelerator.load_state(str(checkpoint))\n",
        "    run.accelerator.load_state(str(checkpoint))\n"
        "    run.optimizer.optimizer.state.pop(next(iter(run.optimizer.optimizer.state)), None)\n",
        ("tests/training/test_trainer.py::test_a_signal_finishes_the_step_checkpoints_and_resumes",),
    ),
    Mutation(
        "export-fc-unpermuted",
        "the eagle3/speculators export sorts the layer ids but leaves fc's column blocks in training order",
        "specheads/methods/eagle/export.py",
        '    state["fc.weight"] = torch.cat([blocks[i] for i in order], dim=1)',
        '    state["fc.weight"] = torch.cat(list(blocks), dim=1)',
        ("tests/methods/eagle/test_speculators_consumer.py",),
        (("SPECHEADS_REQUIRE_SPECULATORS", "1"),),
    ),
    Mutation(
        "draft-model-depth1-q",
        "the draft model reports its first draft's distribution q for every draft depth",
        "specheads/inference/drafters.py",
        "                    probs[i].append(q[i])",
        "                    probs[i].append(probs[i][0] if probs[i] else q[i])",
        ("tests/inference/test_sampling_invariant.py", "tests/inference/test_batched.py"),
    ),
    Mutation(
        "cache-loss-mask",
        "the feature cache stores the attention mask as the loss mask (prompt tokens become targets)",
        "specheads/training/features.py",
        '        "loss_mask": columns["loss_mask"].to(torch.int8).contiguous(),',
        '        "loss_mask": columns["attention_mask"].to(torch.int8).contiguous(),',
        ("tests/training/test_features.py",),
    ),
    Mutation(
        "cache-zero-features",
        "the feature cache serves all-zero features",
        "specheads/training/features.py",
        "        return self._hidden[index].float()",
        "        return self._hidden[index].float() * 0",
        ("tests/training/test_features.py::test_heads_train_from_the_cache_as_with_the_base_in_the_loop",),
    ),
    Mutation(
        "eagle-features-off-by-one",
        "the EAGLE train step pairs token t + 1 with the base's feature of t - 1",
        "specheads/methods/eagle/train.py",
        "    features, view = context.base_features(batch, head.hidden_state_layers, full_logits=False)\n",
        "    features, view = context.base_features(batch, head.hidden_state_layers, full_logits=False)\n"
        "    features = [torch.roll(feature, 1, dims=1) for feature in features]\n",
        (
            "tests/training/test_training_quality.py::test_trained_heads_agree_with_the_base_far_more_than_untrained_ones[eagle3]",
        ),
    ),
    Mutation(
        "dspark-loss-weights-swapped",
        "DSpark's loss weights swapped: 0.9 CE to the data + 0.1 L1 to the base",
        "specheads/methods/dflash/train.py",
        "        per_depth = 0.1 * data_ce + 0.9 * l1",
        "        per_depth = 0.9 * data_ce + 0.1 * l1",
        (
            "tests/methods/dflash/test_dflash_trainer.py::test_the_dspark_loss_is_0_1_ce_plus_0_9_l1_plus_the_confidence_bce_by_hand",
        ),
    ),
)

# Guarantees added with the checks above, one mutation each.
MUTATIONS += (
    Mutation(
        "contamination-ngrams-ignored",
        "the leak check matches whole short prompts only: a copied evaluation question inside a longer turn passes",
        "specheads/contamination.py",
        "                name = self.ngrams.get(gram)",
        "                name = None",
        ("tests/test_contamination.py", "tests/training/test_data.py"),
    ),
    Mutation(
        "simulated-tau-sums",
        "simulated chain tau adds per-depth agreement instead of multiplying it along the chain",
        "specheads/training/evaluate.py",
        "        reach *= float(agreement_by_rank[depth][0])",
        "        reach = float(agreement_by_rank[depth][0])",
        ("tests/training/test_trainer.py::test_simulated_tau_by_hand",),
    ),
    Mutation(
        "length-groups-unshuffled",
        "length-grouped batches are served longest first every epoch instead of shuffled",
        "specheads/training/batches.py",
        "        shuffled = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()] + tail",
        "        shuffled = sorted(batches, key=lambda batch: -self.lengths[batch[0]]) + tail",
        (
            "tests/training/test_trainer.py::test_length_grouped_batches_hold_rows_of_similar_length_and_replay_per_epoch",
        ),
    ),
)
