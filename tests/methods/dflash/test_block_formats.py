"""Block-drafter exports: what each layout writes (the fields the engines read, exactly the drafter's tensors),
the serve commands and their draft-token counts, and ``check_export`` catching every trap an engine falls into
silently or loudly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import tiny_model
from safetensors.torch import load_file, save_file

from specheads.export import check_export, export_heads
from specheads.methods.dflash.heads import DFlashHead
from specheads.methods.eagle.heads import EagleHead

LAYERS, BLOCK = 6, 4


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=1, layers=LAYERS)


def _head(base, variant: str, **kwargs) -> DFlashHead:  # noqa: ANN001, ANN003
    torch.manual_seed(0)
    return DFlashHead.from_base(base, variant=variant, layer_ids=[1, 3, 5], block_size=BLOCK, markov_rank=8, **kwargs)


def _config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def test_the_native_dflash_layout_is_zlabs(base, tmp_path) -> None:
    head = _head(base, "dflash")
    result = export_heads(head, tmp_path / "out", "dflash", base_model=base, base_name="org/base")
    config = _config(result.directory)
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": head.config.mask_token_id, "target_layer_ids": [0, 2, 4],
                                       "block_size": BLOCK}  # fmt: skip
    assert config["num_target_layers"] == LAYERS and config["num_hidden_layers"] == head.config.num_layers
    assert config["layer_types"] == ["full_attention"] * head.config.num_layers and config["is_causal"] is False
    assert config["rope_theta"] == head.config.rope_parameters["rope_theta"] and "rope_parameters" in config
    tensors = load_file(str(result.directory / "model.safetensors"))
    assert set(tensors) == set(head.state_dict())  # no embedding, no lm_head, nothing else
    assert '"num_speculative_tokens": 3' in result.commands["vllm"]
    assert "--speculative-num-draft-tokens 4" in result.commands["sglang"]
    assert "draft-dflash" in result.commands["llama.cpp"]
    assert result.report.ok and set(result.report.engines) == {"vllm", "sglang", "llama.cpp", "dflash"}


def test_the_native_dspark_layout_is_deepspecs(base, tmp_path) -> None:
    head = _head(base, "dspark")
    result = export_heads(head, tmp_path / "out", "dspark", base_model=base)
    config = _config(result.directory)
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["target_layer_ids"] == [0, 2, 4]
    assert config["markov_head_type"] == "vanilla" and config["markov_rank"] == 8
    assert config["enable_confidence_head"] is True and config["sample_from_anchor"] is True
    assert config["num_anchors"] > 0 and config["mask_token_id"] == head.config.mask_token_id
    tensors = load_file(str(result.directory / "model.safetensors"))
    assert {"markov_head.markov_w1.weight", "confidence_head.proj.bias"} <= set(tensors) == set(head.state_dict())
    assert '"num_speculative_tokens": 4' in result.commands["vllm"]
    assert "--speculative-num-draft-tokens 5" in result.commands["sglang"]
    assert "draft-dspark" in result.commands["llama.cpp"]
    assert result.report.ok and set(result.report.engines) == {"vllm", "sglang", "llama.cpp"}


@pytest.mark.parametrize("variant", ["dflash", "dspark"])
def test_the_speculators_layout_says_how_vllm_must_serve_the_block(base, tmp_path, variant: str) -> None:
    result = export_heads(_head(base, variant), tmp_path / "out", "speculators", base_model=base)
    config = _config(result.directory)
    assert config["speculators_model_type"] == variant and config["aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert config["sliding_window_non_causal"] is True  # else vLLM serves the bidirectional layers causally
    assert config["sample_from_anchor"] is (variant == "dspark")  # written: vLLM's dspark default is false
    drafts = BLOCK if variant == "dspark" else BLOCK - 1
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == drafts
    assert config["transformer_layer_config"]["model_type"] == "qwen3" and config["draft_vocab_size"] == 96
    assert check_export(result.directory).format == "speculators"


def _broken(result_dir: Path, tmp_path: Path, edit=None, tensors=None) -> Path:  # noqa: ANN001
    out = tmp_path / "broken"
    shutil.copytree(result_dir, out)
    if edit is not None:
        config = _config(out)
        edit(config)
        (out / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        state = load_file(str(out / "model.safetensors"))
        tensors(state)
        save_file(state, str(out / "model.safetensors"))
    return out


CASES = [
    ("dspark", "dspark", lambda c: c.update(markov_head_type="gated"), None, "vanilla"),
    ("dspark", "dspark", lambda c: c.pop("markov_head_type"), None, "SGLang requires it"),
    ("dspark", "dspark", None, lambda t: [t.pop(k) for k in list(t) if k.startswith("confidence")], "SGLang raises"),
    ("dspark", "dspark", lambda c: c.update(sample_from_anchor=False), None, "slots all predict"),
    ("dflash", "dflash", None, lambda t: t.update({"lm_head.weight": torch.zeros(96, 32)}), "vLLM raises on unknown"),
    ("dflash", "dflash", lambda c: c["dflash_config"].update(target_layer_ids=[0, 2, 5]), None, r"in \[1, 5\]"),
    ("dflash", "dflash", lambda c: c["dflash_config"].update(mask_token_id=96), None, "mask_token_id 96"),
    ("dflash", "dflash", lambda c: [c.pop("rope_parameters"), c.pop("rope_theta")], None, "theta 1e6"),
    ("dflash", "dflash", lambda c: c.update(is_causal=True), None, "causally"),
    ("dflash", "speculators", lambda c: c.update(sliding_window_non_causal=False), None, "causally"),
    ("dspark", "speculators", lambda c: c.pop("sample_from_anchor"), None, "defaults it to false"),
    ("dflash", "speculators", lambda c: c.update(sample_from_anchor=True), None, "slot 0 is the anchor"),
    ("dflash", "speculators", lambda c: c["speculators_config"]["proposal_methods"][0].update(speculative_tokens=4),
     None, "drafts 3"),
]  # fmt: skip


@pytest.mark.parametrize(("variant", "fmt", "edit", "tensors", "message"), CASES)
def test_check_catches_every_trap_of_the_engines(base, tmp_path, variant, fmt, edit, tensors, message) -> None:  # noqa: ANN001
    result = export_heads(_head(base, variant), tmp_path / "out", fmt, base_model=base)
    report = check_export(_broken(result.directory, tmp_path, edit, tensors))
    assert not report.ok
    assert any(__import__("re").search(message, problem) for problem in report.all_problems()), report.render()


def test_heads_of_another_kind_are_refused_with_nothing_written(base, tmp_path) -> None:
    with pytest.raises(ValueError, match="holds dspark heads; these are dflash"):
        export_heads(_head(base, "dflash"), tmp_path / "a", "dspark", base_model=base)
    with pytest.raises(ValueError, match="holds block drafters"):
        export_heads(EagleHead.from_base(base), tmp_path / "b", "dflash", base_model=base)
    with pytest.raises(ValueError, match="EAGLE-3"):
        export_heads(_head(base, "dflash"), tmp_path / "c", "eagle3", base_model=base)
    assert not any(tmp_path.iterdir())
