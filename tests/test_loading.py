"""The facts read from models and tokenizers in one place: vocabulary size and agreement, EOS ids, pad id."""

from __future__ import annotations

import pytest
from helpers import tiny_model, tiny_tokenizer

from specheads.loading import check_same_vocabulary, eos_token_ids, pad_token_id, vocab_size


def test_vocabulary_size_and_agreement() -> None:
    base, same, other = tiny_model("llama"), tiny_model("gpt2", seed=1), tiny_model("llama", vocab_size=128)
    assert vocab_size(base) == 96 and vocab_size(other) == 128
    check_same_vocabulary(base, same)
    with pytest.raises(ValueError, match=r"vocabulary \(128 tokens\) differs from the base's \(96\)"):
        check_same_vocabulary(base, other)


def test_eos_ids_come_from_the_override_then_the_generation_config_then_the_tokenizer() -> None:
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    assert model.generation_config.eos_token_id is None
    assert eos_token_ids(model) == frozenset()
    assert eos_token_ids(model, tokenizer) == {tokenizer.eos_token_id}
    model.generation_config.eos_token_id = [7, 9]
    assert eos_token_ids(model, tokenizer) == {7, 9}
    assert eos_token_ids(model, tokenizer, override=3) == {3}


def test_pad_id_prefers_the_tokenizer_then_the_config_then_eos() -> None:
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    tokenizer.pad_token, model.generation_config.pad_token_id = None, None
    assert pad_token_id(model) is None
    assert pad_token_id(model, tokenizer) == tokenizer.eos_token_id
    model.generation_config.eos_token_id = [7, 9]
    assert pad_token_id(model) == 7
    model.generation_config.pad_token_id = 4
    assert pad_token_id(model, tokenizer) == 4
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(5)
    assert pad_token_id(model, tokenizer) == 5


def test_a_small_local_checkpoint_loads_without_transformers_progress_bar(tmp_path, capsys) -> None:
    from transformers.utils import logging as hf_logging

    from specheads.loading import load_causal_lm

    tiny_model("llama").save_pretrained(tmp_path / "base")
    capsys.readouterr()
    load_causal_lm(str(tmp_path / "base"))
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # switched off for the load only


def test_bench_drops_only_the_warning_transformers_raises_about_its_own_assisted_call() -> None:
    import logging

    from specheads.bench import _own_assisted_call_warning

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("transformers.generation.utils", logging.WARNING, __file__, 1, message, None, None)

    own = "Passing `generation_config` together with generation-related arguments=({'min_new_tokens'}) is deprecated"
    assert not _own_assisted_call_warning(record(own))
    assert _own_assisted_call_warning(record("Setting `pad_token_id` to `eos_token_id`"))
