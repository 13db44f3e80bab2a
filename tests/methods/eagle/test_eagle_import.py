"""Importing EAGLE-3 files as engines and other trainers really write them, built here by hand from the layouts'
names and config keys (SpecForge's export and SGLang's ``LlamaForCausalLMEagle3``, vLLM's speculators format; the
sources ``tests/export/test_import.py`` cites), never by specheads' writer: feature layers listed in any order, a draft
map given only as ``t2d``, a non-default RoPE. Each import must draft exactly what the original head drafts: the same
logits over the target vocabulary."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest
import torch
from safetensors.torch import save_file

from specheads import load_heads
from specheads.heads import EagleHead

LAYER_IDS = [7, 2, 5]  # the order the head was trained with; engines capture layers 2, 5, 7 in layer order


def _head(base, rope: dict | None = None) -> EagleHead:
    """A reduced-vocabulary EAGLE-3 head with random weights everywhere (norms too), fusing layers 7, 2, 5."""
    torch.manual_seed(0)
    counts = torch.randint(1, 100, (base.config.vocab_size,))
    counts[0] = 0  # the pad token: outside the draft vocabulary, so draft id 0 is not target id 0
    head = EagleHead.from_base(base, version=3, layer_ids=LAYER_IDS, draft_vocab_size=64, token_counts=counts)
    if rope is not None:
        state = head.state_dict()
        head = EagleHead(replace(head.config, rope_parameters=rope), base)
        head.load_state_dict(state)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return head.eval()


def _layer_tensors(head: EagleHead, prefix: str) -> dict[str, torch.Tensor]:
    """The draft layer under the layout's prefix (``midlayer.`` SpecForge, ``layers.0.`` speculators / ModelOpt)."""
    layer = head.midlayer
    tensors = {
        "self_attn.q_proj.weight": layer.self_attn.q_proj.weight,
        "self_attn.k_proj.weight": layer.self_attn.k_proj.weight,
        "self_attn.v_proj.weight": layer.self_attn.v_proj.weight,
        "self_attn.o_proj.weight": layer.self_attn.o_proj.weight,
        "mlp.gate_proj.weight": layer.mlp.gate_proj.weight,
        "mlp.up_proj.weight": layer.mlp.up_proj.weight,
        "mlp.down_proj.weight": layer.mlp.down_proj.weight,
        "hidden_norm.weight": layer.hidden_norm.weight,
        "input_layernorm.weight": layer.input_layernorm.weight,
        "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
    }
    return {prefix + name: value for name, value in tensors.items()}


def _tensors(head: EagleHead, prefix: str = "midlayer.") -> dict[str, torch.Tensor]:
    """fc's input blocks in the order engines concatenate the features: layers 2, 5, 7, which the head (trained on
    7, 2, 5) holds as blocks 1, 2, 0."""
    blocks = head.fc.weight.split(head.config.hidden_size, dim=1)
    return {
        **_layer_tensors(head, prefix),
        "fc.weight": torch.cat([blocks[1], blocks[2], blocks[0]], dim=1),
        "norm.weight": head.norm.weight,
        "lm_head.weight": head.lm_head.weight,
        "d2t": head.d2t,  # offsets: target id = draft id + d2t[draft id]
        "t2d": head.t2d,  # True where a target id is in the draft vocabulary
    }


def _layer_config(head: EagleHead) -> dict:
    """The Llama fields of the draft layer (SpecForge's and ModelOpt's config.json, speculators' layer config)."""
    c = head.config
    return {
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _eagle3_config(head: EagleHead, **extra) -> dict:
    """SpecForge / SGLang's ``LlamaForCausalLMEagle3`` config.json."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        **_layer_config(head),
        "draft_vocab_size": head.config.draft_vocab_size,
        **extra,
    }


def _speculators_config(head: EagleHead, layer_ids: list[int], layer_config: dict) -> dict:
    """vLLM's speculators format (``speculators_model_type: eagle3``, ids as hidden_states indices)."""
    return {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3DraftModel"],
        "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **layer_config},
        "draft_vocab_size": head.config.draft_vocab_size,
        "norm_before_residual": False,
        "target_hidden_size": head.config.hidden_size,
        "eagle_aux_hidden_state_layer_ids": layer_ids,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": None, "architectures": ["LlamaForCausalLM"]},
        },
    }


def _write(directory, config: dict, tensors: dict) -> str:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    contiguous = {name: value.detach().contiguous() for name, value in tensors.items()}
    save_file(contiguous, str(directory / "model.safetensors"))
    return str(directory)


def _import(directory: str, base) -> EagleHead:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*without a fingerprint of its base")
        return load_heads(directory, base)


def _drafts(head: EagleHead, base) -> torch.Tensor:
    """``[steps, B, T - 1, V]`` three unrolled draft steps' logits over the target vocabulary (-inf outside the draft
    vocabulary), on the features of the layers the head says it reads."""
    ids = torch.randint(2, base.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden_states = base(ids, output_hidden_states=True).hidden_states
        _, logits = head(ids, [hidden_states[i] for i in head.hidden_state_layers], steps=3)
    full = torch.full((3, *ids.shape[:1], ids.shape[1] - 1, base.config.vocab_size), float("-inf"))
    full[..., head.draft_token_ids()] = torch.stack(logits)
    return full


LAYER_ID_FILES = {
    # vLLM's convention at the top level (a hidden_states index), in the order the trainer listed them
    "eagle3-vllm-ids": lambda head: (_eagle3_config(head, eagle_aux_hidden_state_layer_ids=LAYER_IDS), "midlayer."),
    # SGLang's convention (output of layer id: one less) in eagle_config, the only ids SGLang reads
    "eagle3-sglang-ids": lambda head: (
        _eagle3_config(head, eagle_config={"eagle_aux_hidden_state_layer_ids": [i - 1 for i in LAYER_IDS]}),
        "midlayer.",
    ),
    "speculators": lambda head: (_speculators_config(head, LAYER_IDS, _layer_config(head)), "layers.0."),
}


@pytest.mark.parametrize("layout", LAYER_ID_FILES)
def test_feature_layers_listed_out_of_order_import_in_layer_order_and_draft_as_the_original(
    base, tmp_path, layout
) -> None:
    original = _head(base)
    config, prefix = LAYER_ID_FILES[layout](original)
    tensors = _tensors(original, prefix)
    if layout == "speculators":
        tensors["embed_tokens.weight"] = base.get_input_embeddings().weight
    imported = _import(_write(tmp_path / "heads", config, tensors), base)
    assert imported.config.layer_ids == [2, 5, 7]
    torch.testing.assert_close(_drafts(imported, base), _drafts(original, base))


def test_a_draft_map_given_as_t2d_alone_imports_with_the_same_target_ids(base, tmp_path) -> None:
    """t2d marks the draft vocabulary's target ids; draft id i is the i-th of them (d2t[i] = that id - i)."""
    original = _head(base)
    tensors = _tensors(original)
    del tensors["d2t"]
    config = _eagle3_config(original, eagle_aux_hidden_state_layer_ids=LAYER_IDS)
    imported = _import(_write(tmp_path / "heads", config, tensors), base)
    assert torch.equal(imported.draft_token_ids(), original.t2d.nonzero().flatten())
    torch.testing.assert_close(_drafts(imported, base), _drafts(original, base))


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
ROPE_FIELDS = {
    # SpecForge's apply_legacy_rope_scaling and ModelOpt's template: top-level rope_theta and rope_scaling
    "legacy-rope_theta-rope_scaling": lambda rope: {
        "rope_theta": rope["rope_theta"],
        "rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"},
    },
    # transformers 5's config.to_dict(): rope_parameters
    "rope_parameters": lambda rope: {"rope_parameters": dict(rope)},
}


@pytest.mark.parametrize("fields", ROPE_FIELDS)
@pytest.mark.parametrize("layout", ["eagle3", "speculators"])
def test_a_non_default_rope_in_the_file_is_carried_into_the_imported_head(base, tmp_path, fields, layout) -> None:
    original = _head(base, rope=LLAMA3_ROPE)
    default = _head(base)  # the same weights with the base's default RoPE
    assert not torch.allclose(_drafts(default, base), _drafts(original, base))  # the RoPE matters at these positions
    rope = ROPE_FIELDS[fields](LLAMA3_ROPE)
    if layout == "eagle3":
        config = _eagle3_config(original, eagle_aux_hidden_state_layer_ids=LAYER_IDS, **rope)
        tensors = _tensors(original)
    else:
        config = _speculators_config(original, LAYER_IDS, {**_layer_config(original), **rope})
        tensors = {**_tensors(original, "layers.0."), "embed_tokens.weight": base.get_input_embeddings().weight}
    imported = _import(_write(tmp_path / "heads", config, tensors), base)
    assert imported.config.rope_parameters == LLAMA3_ROPE
    torch.testing.assert_close(_drafts(imported, base), _drafts(original, base))
