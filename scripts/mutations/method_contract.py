"""The method contract: the API split by phase (decoding imports no training or export), the public ``register``,
the typed parts an entry names, and the ``calibratable`` capability that calibrate and the CLI honour."""

from mutations import Mutation

API = "tests/methods/test_api.py"
CONFORMANCE = "tests/methods/test_conformance.py"
DECODE_IMPORTS = f"{API}::test_heads_drafters_and_the_decoder_import_nothing_of_training_or_export"
REGISTERED_CLI = f"{CONFORMANCE}::test_a_method_registered_through_the_public_call_is_an_export_format_of_the_cli"
TOY = f"{CONFORMANCE}::test_a_new_method_is_a_folder_and_an_entry"
CALIBRATES = f"{CONFORMANCE}::test_a_method_calibrates_or_declares_it_cannot"
TYPES = "tests/methods/test_types.py"
CLI_REFUSAL = (
    "tests/test_calibrate.py::test_calibrate_refuses_in_one_line_heads_whose_entry_says_they_cannot_be_calibrated"
)

MUTATIONS = (
    Mutation(
        "drafter-imports-the-whole-method-api",
        "a drafter imports from the method API's facade, which loads training and export, not from its decode phase",
        "specheads/methods/medusa/drafter.py",
        "from specheads.methods.api_decode import (",
        "from specheads.methods.api import (",
        (DECODE_IMPORTS,),
    ),
    Mutation(
        "register-adds-nothing",
        "register() checks the entry and returns it without adding it to the registry",
        "specheads/registry.py",
        "    HEAD_TYPES[entry.name] = entry\n    return entry\n",
        "    return entry\n",
        (REGISTERED_CLI, TOY),
    ),
    Mutation(
        "draft-lm-declared-calibratable",
        "draft-LM's entry loses calibratable=False: calibrate runs on an evaluation without agreement by rank",
        "specheads/registry.py",
        "        calibratable=False,  # one chain of its own greedy tokens: no agreement by rank, no tree to choose\n",
        "",
        (CLI_REFUSAL, f"{CALIBRATES}[draft-lm]"),
    ),
    Mutation(
        "calibrate-ignores-calibratable",
        "calibrate() does not read the entry's calibratable and fails later with a KeyError",
        "specheads/calibrate.py",
        "    if not method.calibratable:\n",
        "    if False:\n",
        (CLI_REFUSAL, f"{CALIBRATES}[draft-lm]"),
    ),
    Mutation(
        "evaluation-key-outside-the-contract",
        "the shared agreement summary names its positions key 'position', a key the Evaluation type does not have",
        "specheads/training/evaluate.py",
        '        "positions": [int(c) for c in counts],',
        '        "position": [int(c) for c in counts],',
        (f"{CONFORMANCE}::test_a_method_evaluates_agreement_per_depth[eagle]",),
    ),
    Mutation(
        "writer-takes-another-argument",
        "Medusa's folder writer grows a required parameter that the FolderWriter protocol does not pass",
        "specheads/methods/medusa/export.py",
        "engines: list[str] | None, steps: int | None\n) -> FolderContents:",
        "engines: list[str] | None, steps: int | None, dtype: Any\n) -> FolderContents:",
        (f"{CONFORMANCE}::test_every_listed_format_has_its_spec_and_every_layout_its_method[medusa]",),
    ),
    Mutation(
        "drafter-annotation-contradicts-its-body",
        "Medusa's drafter declares that resolve() returns a depth while it returns the tree (only the type check sees)",
        "specheads/methods/medusa/drafter.py",
        "    def resolve(self, tree: str | list) -> TreeBuffers:",
        "    def resolve(self, tree: str | list) -> int:",
        (TYPES,),
    ),
)
