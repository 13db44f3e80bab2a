"""The numbers that choose trees (EAGLE's held-out agreement by depth, simulated tau, calibrate's pick) and the import
branches for what engines write (feature layers in any order, t2d without d2t, a legacy RoPE).
"""

from mutations import Mutation

EAGLE_EVALUATION = "tests/methods/eagle/test_eagle_evaluation.py"
AGREEMENT_BY_HAND = (
    f"{EAGLE_EVALUATION}::test_agreement_by_depth_and_rank_counts_the_positions_the_draft_reached_on_the_bases_path"
)
CHOICE = "tests/test_calibrate_choice.py"
IMPORT = "tests/methods/eagle/test_eagle_import.py"

MUTATIONS = (
    Mutation(
        "eagle-agreement-all-positions",
        "EAGLE's agreement at depth d divides by every target position, not by the positions the draft reached on "
        "the base's own path",
        "specheads/methods/eagle/train.py",
        "            counts[step] += valid.sum()",
        "            counts[step] += valid_tokens[:, 2 + step :].sum()",
        (AGREEMENT_BY_HAND,),
    ),
    Mutation(
        "eagle-agreement-previous-depth-target",
        "EAGLE's agreement scores depth d against the base's token of depth d - 1 (one position early)",
        "specheads/methods/eagle/train.py",
        "            wanted = greedy[:, 1 + step : 1 + step + count]",
        "            wanted = greedy[:, step : step + count]",
        (AGREEMENT_BY_HAND,),
    ),
    Mutation(
        "eagle-agreement-path-check-shifted",
        "EAGLE's agreement checks whether the draft is still on the base's path one data token early",
        "specheads/methods/eagle/train.py",
        "            on_path[:, :count] &= input_ids[:, 2 + step :] == wanted",
        "            on_path[:, :count] &= input_ids[:, 1 + step : 1 + step + count] == wanted",
        (AGREEMENT_BY_HAND,),
    ),
    Mutation(
        "grow-tree-parent-depth",
        "tree growth multiplies a child's path probability by its parent's depth's agreement",
        "specheads/inference/trees.py",
        "float(agreement_by_rank[len(path)][rank])",
        "float(agreement_by_rank[len(path) - 1][rank])",
        (f"{EAGLE_EVALUATION}::test_simulated_tau_of_the_measured_agreement_by_hand", CHOICE),
    ),
    Mutation(
        "calibrate-maximises-tau",
        "the cost model picks the tree with the most expected tokens per step, whatever verifying it costs",
        "specheads/calibrate.py",
        '    best = max(candidates, key=lambda row: row["expected_tokens_per_s"])',
        '    best = max(candidates, key=lambda row: row["expected_tau"])',
        (CHOICE,),
    ),
    Mutation(
        "calibrate-tie-keeps-largest",
        "of tree sizes the cost model rates equally fast, the largest is kept",
        "specheads/calibrate.py",
        '    best = max(candidates, key=lambda row: row["expected_tokens_per_s"])',
        '    best = max(reversed(candidates), key=lambda row: row["expected_tokens_per_s"])',
        (CHOICE,),
    ),
    Mutation(
        "calibrate-records-the-modelled-tree",
        "tree.json's static tree is the cost model's pick, not the fastest measured tree",
        "specheads/calibrate.py",
        '        "choices": max(measured[: len(statics)], key=lambda row: row["tokens_per_s"])["tree"],',
        '        "choices": best.choices,',
        (CHOICE,),
    ),
    Mutation(
        "calibrate-dynamic-largest",
        "the recorded EAGLE-2 dynamic tree is the largest one timed, not the fastest",
        "specheads/calibrate.py",
        'max(grown, key=lambda pair: pair[0]["tokens_per_s"])',
        'max(grown, key=lambda pair: pair[0]["nodes"])',
        (CHOICE,),
    ),
    Mutation(
        "import-keeps-listed-layer-order",
        "an EAGLE-3 import keeps the config's order of feature layers, though engines concatenate them in layer order",
        "specheads/methods/eagle/export.py",
        "        ids = sorted(ids)",
        "        ids = list(ids)",
        (IMPORT,),
    ),
    Mutation(
        "import-t2d-offsets-off-by-one",
        "an import that derives d2t from t2d counts draft ids from 1: every draft id maps one target id low",
        "specheads/methods/eagle/export.py",
        "        d2t = targets - torch.arange(targets.numel())",
        "        d2t = targets - torch.arange(1, targets.numel() + 1)",
        (IMPORT,),
    ),
    Mutation(
        "import-drops-legacy-rope",
        "an EAGLE import drops the legacy rope_theta / rope_scaling fields (as if only rope_parameters counted)",
        "specheads/methods/eagle/export.py",
        'if k not in ("architectures", "auto_map")})',
        'if k not in ("architectures", "auto_map", "rope_theta", "rope_scaling")})',
        (IMPORT,),
    ),
)
