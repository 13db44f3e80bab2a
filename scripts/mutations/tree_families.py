"""Grown trees owned by their families: the engine reads a family's names, size keywords and records, and a kind
defined in the tests decodes with no engine edit."""

from mutations import Mutation

FAMILIES = "tests/inference/test_tree_families.py"
EAGLE_TREES = "tests/methods/eagle/test_eagle_trees.py"
DFLASH_TREES = "tests/methods/dflash/test_dflash_trees.py"
CALIBRATE = "tests/test_calibrate.py"

MUTATIONS = (
    Mutation(
        "tree-families-registry-only",
        "the engine knows only the families method entries name: a family registered on its own is never consulted",
        "specheads/inference/trees.py",
        "    families = [entry.tree_family() for entry in HEAD_TYPES.values()] + _REGISTERED",
        "    families = [entry.tree_family() for entry in HEAD_TYPES.values()]",
        (FAMILIES,),
    ),
    Mutation(
        "tree-size-keywords-dropped",
        "the decoder takes the drafter's own tree of a bare kind but drops the size keywords set for it",
        "specheads/inference/decoder.py",
        "        return family.override(self.drafter.resolve(config.tree), fields)",
        "        return family.override(self.drafter.resolve(config.tree), {})",
        (FAMILIES,),
    ),
    Mutation(
        "tree-size-keywords-unchecked",
        "size keywords are not checked against the tree's family: a keyword the family does not take passes",
        "specheads/inference/generation.py",
        "            _check_tree_size(self.tree, given)",
        "            pass",
        (FAMILIES,),
    ),
    Mutation(
        "grown-name-refusal-lost",
        "a static drafter given a grown tree's name calls it an unknown tree instead of naming who grows it",
        "specheads/inference/trees.py",
        "        family = None if looks_like_path else family_of(text)",
        "        family = None",
        (FAMILIES,),
    ),
    Mutation(
        "eagle-calibrated-tree-ignored",
        "EAGLE's family does not read the recorded EAGLE-2 tree back: the drafter keeps its small default",
        "specheads/methods/eagle/trees.py",
        "        return DynamicTree(**fields) if fields else None",
        "        return None",
        (EAGLE_TREES,),
    ),
    Mutation(
        "ddtree-budget-read-from-kind",
        "DDTree's family reads the recorded budget under its tree name, not the record's field: never found",
        "specheads/methods/dflash/trees.py",
        "        budget = calibration.record.get(RECORD) if calibration is not None else None",
        "        budget = calibration.record.get(KIND) if calibration is not None else None",
        (DFLASH_TREES,),
    ),
    Mutation(
        "calibrate-summary-without-family",
        "calibrate's report leaves out what the method's tree family recorded (the grown tree for this machine)",
        "specheads/calibrate.py",
        "        lines += self.family.summary(record)\n",
        "",
        (f"{CALIBRATE}::test_calibrate_eagle_heads_writes_a_static_tree_and_dynamic_parameters",),
    ),
)
