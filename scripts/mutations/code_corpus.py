"""The code corpus (``data.format: code``): the held-out split of files, the leak screen of HumanEval's solutions, the
manifest's hashes and the rerun's check of the recorded files."""

from mutations import Mutation

TESTS = "tests/training/test_code_corpus.py"
SPLIT_BY_FILE = f"{TESTS}::test_files_are_held_out_whole_and_by_their_path_alone"
LEAK_SCREEN = f"{TESTS}::test_a_file_copying_a_humaneval_prompt_or_canonical_solution_is_dropped_and_counted"
HASHES = f"{TESTS}::test_the_manifest_records_every_file_used_with_the_sha256_of_its_bytes"
RERUN = f"{TESTS}::test_a_rerun_uses_the_recorded_files_and_refuses_changed_ones"
EVAL_FILES = f"{TESTS}::test_a_code_recipes_evaluation_files_are_read_apart_from_its_manifest"
RECIPE = f"{TESTS}::test_the_qwen_coder_recipe_validates_and_trains_a_few_steps_on_a_tiny_qwen2"

MUTATIONS = (
    Mutation(
        "code-split-by-line",
        "the code corpus splits lines, not files: every file's lines go to train or held out by a hash of the line",
        "specheads/training/code_corpus.py",
        "        for file in self.split_files(split)[:limit]:\n"
        '            yield {"text": Path(file.path).read_bytes().decode("utf-8"), "source": file.path}\n',
        "        for file in self.files[:limit]:\n"
        '            for line in Path(file.path).read_bytes().decode("utf-8").splitlines(keepends=True):\n'
        '                if (path_hash(line) < self.settings["heldout_fraction"]) == (split == "heldout"):\n'
        '                    yield {"text": line, "source": file.path}\n',
        (SPLIT_BY_FILE,),
    ),
    Mutation(
        "code-leak-screen-prompts-only",
        "the code leak screen indexes HumanEval's prompts only, not their canonical solutions",
        "specheads/contamination.py",
        '                record["prompt"] + record["canonical_solution"]\n',
        '                record["prompt"]\n',
        (LEAK_SCREEN,),
    ),
    Mutation(
        "code-manifest-hash-first-chunk",
        "the manifest's sha256 covers a file's first 64 KiB only, not its bytes",
        "specheads/training/code_corpus.py",
        '            digest = hashlib.sha256(data).hexdigest() if data is not None else ""',
        '            digest = hashlib.sha256(data[: 1 << 16]).hexdigest() if data is not None else ""',
        (HASHES,),
    ),
    Mutation(
        "code-rerun-checks-first-file-only",
        "a rerun checks the first recorded file's sha256 only: the others may have changed",
        "specheads/training/code_corpus.py",
        "    for file in files:\n        _check_unchanged(file, path)\n",
        "    for file in files[:1]:\n        _check_unchanged(file, path)\n",
        (RERUN,),
    ),
    Mutation(
        "code-eval-files-read-with-the-training-manifest",
        "data.eval_paths of a code recipe are checked against the training corpus's manifest (and refused)",
        "specheads/training/files.py",
        "        exclude_prompts=[],\n        manifest=None,\n",
        "        exclude_prompts=[],\n",
        (EVAL_FILES,),
    ),
    Mutation(
        "eagle-intermediate-size-ignored",
        "heads.intermediate_size is validated but the EAGLE head is built with the base's MLP width",
        "specheads/methods/eagle/train.py",
        "        intermediate_size=section.intermediate_size,\n",
        "",
        (RECIPE,),
    ),
)
