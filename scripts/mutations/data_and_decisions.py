"""Data screening and the draft vocabulary on chat data; the decision tables of ``--dtype auto`` and of part joins."""

from mutations import Mutation

LATER_TURN_SCREENED = (
    "tests/training/test_data.py::test_a_chat_copying_an_evaluation_prompt_in_a_later_user_turn_is_dropped_and_counted"
)
EVERY_TURN_INDEXED = "tests/test_contamination.py::test_every_user_turn_is_screened_on_both_sides"
DTYPE_TABLE = "tests/test_loading.py::test_dtype_auto_loads_the_documented_dtype_for_every_stored_dtype_and_machine"
MISSING_PART = "tests/assets/test_joined_bases.py::test_a_missing_middle_part_of_22_is_named_alone"

MUTATIONS = (
    # ------------------------------------------------------------------------------ screening: every user turn
    Mutation(
        "screen-first-user-turn-only",
        "the training data's leak check reads a conversation's first user turn only",
        "specheads/training/data.py",
        'else [m["content"] for m in messages if m["role"] == "user"]',
        'else [m["content"] for m in messages if m["role"] == "user"][:1]',
        (LATER_TURN_SCREENED,),
    ),
    Mutation(
        "leak-index-first-turn-only",
        "an evaluation record's 'turns' are indexed up to the first (MT-Bench's second turns are not prompts)",
        "specheads/contamination.py",
        "        texts.extend(turn for turn in turns if isinstance(turn, str))",
        "        texts.extend(turn for turn in turns[:1] if isinstance(turn, str))",
        (EVERY_TURN_INDEXED, LATER_TURN_SCREENED),
    ),
    Mutation(
        "prompt-texts-first-user-message-only",
        "prompt_texts stops at the first user message of a conversation",
        "specheads/contamination.py",
        '                if role in ("human", "user") and isinstance(content, str):\n'
        "                    texts.append(content)\n",
        '                if role in ("human", "user") and isinstance(content, str):\n'
        "                    texts.append(content)\n"
        "                    break\n",
        (EVERY_TURN_INDEXED,),
    ),
    Mutation(
        "distill-screen-ignores-followups",
        "distill's leak check reads a 'turns' prompt's first turn, not the follow-ups --all-turns asks",
        "specheads/training/distill.py",
        'if role == "user"] + list(prompt.followups)',
        'if role == "user"]',
        (
            "tests/training/test_distill.py::test_a_prompt_whose_later_turn_copies_an_evaluation_prompt_is_skipped_and_counted",
        ),
    ),
    # ------------------------------------------------------------------------ targets: answers, every turn
    Mutation(
        "draft-vocab-counts-all-tokens",
        "the draft vocabulary counts every token of the rows (prompts too), not the targets",
        "specheads/methods/eagle/train.py",
        '        mask = torch.as_tensor(rows["loss_mask"]).bool()',
        '        mask = torch.as_tensor(rows["attention_mask"]).bool()',
        (
            "tests/methods/eagle/test_eagle_trainer.py::test_the_draft_vocabulary_holds_the_answer_tokens_of_chat_data_not_the_prompt_tokens",
        ),
    ),
    Mutation(
        "loss-mask-last-assistant-turn-only",
        "a conversation's targets are its last assistant turn only",
        "specheads/training/chat.py",
        "            spans.append((start, end))",
        "            spans = [(start, end)]",
        (
            "tests/training/test_data.py::test_every_assistant_turn_of_a_long_chat_is_a_target_and_no_user_or_system_token_is",
        ),
    ),
    # ---------------------------------------------------------------------------------------- --dtype auto
    Mutation(
        "dtype-auto-bf16-without-bf16-units",
        "--dtype auto keeps a bf16 or quantized-GGUF checkpoint in bf16 on a CPU without bf16 units",
        "specheads/loading.py",
        "    if cpu_has_native_bf16():\n"
        '        if stored == "bfloat16" or gguf.was_quantized(path):\n'
        "            return torch.bfloat16\n"
        '        return "auto"\n',
        '    if stored == "bfloat16" or gguf.was_quantized(path):\n'
        "        return torch.bfloat16\n"
        "    if cpu_has_native_bf16():\n"
        '        return "auto"\n',
        (DTYPE_TABLE,),
    ),
    Mutation(
        "dtype-auto-fp16-kept-without-bf16-units",
        "--dtype auto upcasts bf16 checkpoints on a CPU without bf16 units but leaves fp16 ones in fp16",
        "specheads/loading.py",
        '    if stored in ("bfloat16", "float16"):',
        '    if stored == "bfloat16":',
        (DTYPE_TABLE,),
    ),
    Mutation(
        "dtype-auto-quantized-gguf-ignored",
        "--dtype auto takes bf16 for a bf16 checkpoint only, not for a quantized GGUF's float32 folder",
        "specheads/loading.py",
        '        if stored == "bfloat16" or gguf.was_quantized(path):',
        '        if stored == "bfloat16":',
        (DTYPE_TABLE,),
    ),
    Mutation(
        "cpu-bf16-any-avx512",
        "any AVX-512 CPU is taken for one with bf16 units",
        "specheads/loading.py",
        '    return "avx512_bf16" in flags or "amx_bf16" in flags',
        '    return "avx512" in flags or "amx_bf16" in flags',
        ("tests/test_loading.py::test_bf16_units_are_read_from_the_cpu_flags_unless_overridden",),
    ),
    # ------------------------------------------------------------------------------------------ part joins
    Mutation(
        "join-parts-in-string-order",
        "the parts are joined in the string order of their paths (part1, part10, ..., part2)",
        "specheads/assets/__init__.py",
        "    paths = _part_paths(what, named)",
        "    paths = sorted(_part_paths(what, named))",
        ("tests/assets/test_joined_bases.py::test_22_parts_join_in_numeric_order",),
    ),
    Mutation(
        "join-skips-an-absent-part",
        "a part whose package is not installed is skipped instead of named",
        "specheads/assets/__init__.py",
        "            absent.append(requirement)\n            continue\n",
        "            continue\n",
        (MISSING_PART,),
    ),
    Mutation(
        "join-skips-a-part-without-its-file",
        "a part installed without its file is skipped instead of named",
        "specheads/assets/__init__.py",
        "        if not path.is_file():\n            broken.append((requirement, path))\n        paths.append(path)\n",
        "        if path.is_file():\n            paths.append(path)\n",
        (MISSING_PART,),
    ),
    Mutation(
        "join-hash-check-dropped",
        "the joined file's hash is computed but never compared: a wrong join is kept",
        "specheads/assets/__init__.py",
        "        if digest.hexdigest() != named.sha256:\n            raise MissingAssetsError(",
        "        if False:  # the comparison, dropped\n            raise MissingAssetsError(",
        ("tests/assets/test_joined_bases.py::test_a_wrong_join_of_22_is_rejected_by_the_hash",),
    ),
)
