"""Heads published in engine layouts load as specheads heads and decode losslessly: SpecForge, NVIDIA ModelOpt and the
official EAGLE-1 repository, written here from tables of the tensor names and config keys those projects' own code
writes (cited at each table), and FasterDecoding Medusa; exports of every format load back into heads that draft
exactly what the originals draft."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from helpers import greedy_reference, tiny_model
from safetensors.torch import save_file

from specheads import HeadCheckpointError, SpecDecoder, load_heads
from specheads.export import export_heads
from specheads.heads import EagleHead, MedusaHeads, head_type_of

VOCAB = 96
PROMPTS = [torch.randint(2, VOCAB, (1, n), generator=torch.Generator().manual_seed(n)) for n in (1, 6, 17)]


# ================================================================================================ foreign layouts
# Each table maps a name one project writes for a one-layer EAGLE head to the tensor's role, named by the specheads
# tensor that plays it (or EMBEDDING, the base's input embedding). The values come from a trained specheads head, so
# that an import can be compared with the original; every name written comes from the table, read in the project's
# code at the commit cited. specheads' own state_dict names never reach a fixture file.
EMBEDDING = "<the base's embed_tokens>"

# SpecForge, github.com/sgl-project/SpecForge at a6b6b02 (2026-08-08):
# * specforge/modeling/draft/llama3_eagle.py: LlamaForCausalLMEagle3.__init__ (l. 1654-1699) registers embed_tokens,
#   midlayer, fc (3 x hidden inputs, bias=False), norm, lm_head (draft_vocab_size rows) and the buffers t2d (bool,
#   vocab_size) and d2t (int64, draft_vocab_size); LlamaDecoderLayer.__init__ (l. 1570-1596): self_attn, mlp,
#   hidden_norm, input_layernorm, post_attention_layernorm; LlamaAttention.__init__ (l. 555-566): q_proj, k_proj,
#   v_proj (2 x hidden inputs), o_proj; LlamaMLP.__init__ (l. 1513-1515): gate_proj, up_proj, down_proj.
# * specforge/export/to_sglang.py, export_to_sglang (l. 57-88): the state dict's own names (WEIGHT_MAPS, l. 33, is
#   the identity for LlamaForCausalLMEagle3) less every key containing "embed" (l. 85), by save_pretrained
#   (model.safetensors + config.json). d2t holds offsets, t2d a mask: specforge/data/preprocessing.py,
#   process_token_dict_to_mappings (l. 763-764).
# Engines read these names as they are: SGLang python/sglang/srt/models/llama_eagle3.py (at 03d5a77: LlamaModel's
# module is midlayer; LlamaForCausalLMEagle3.load_weights turns d2t into hot_token_id and skips t2d); vLLM
# vllm/model_executor/models/llama_eagle3.py (at 00bd149: LlamaModel.load_weights renames "midlayer." to
# "layers.0."; Eagle3LlamaForCausalLM.load_weights reads d2t, skips t2d, takes embed_tokens only when present).
SPECFORGE_TENSORS = {
    "fc.weight": "fc.weight",
    "midlayer.self_attn.q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight": "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight": "midlayer.mlp.down_proj.weight",
    "midlayer.hidden_norm.weight": "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight": "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "d2t": "d2t",
    "t2d": "t2d",
}
# specforge/export/to_hf.py, export_to_hf (l. 68-116) writes the whole state dict: the target's embedding as well
# (read from the target, l. 112).
SPECFORGE_TO_HF_TENSORS = {**SPECFORGE_TENSORS, "embed_tokens.weight": EMBEDDING}

# NVIDIA ModelOpt, github.com/NVIDIA/Model-Optimizer (formerly TensorRT-Model-Optimizer) at a2fbac7 (2026-08-21):
# * modelopt/torch/export/plugins/hf_spec_export.py: EagleExporter._extract_state_dict (l. 167-180) writes the draft
#   module's own names with the "eagle_module." prefix removed (l. 172), and the base's lm_head.weight when the draft
#   has none (l. 176); LLAMA_EAGLE_SINGLE_LAYER (l. 49-64) lists every one of them for a Llama draft;
#   EagleExporter.export writes model.safetensors (l. 283) and config.json (l. 289).
# * modelopt/torch/speculative/plugins/modeling_eagle.py, EagleModule.__init__: layers (l. 36), norm (l. 40), d2t
#   (int64) only for a reduced draft vocabulary and never a t2d (l. 51), lm_head (l. 52), fc (l. 60),
#   layers[0].input_layernorm and layers[0].hidden_norm (l. 77-80).
# ModelOpt writes layers.0.* since a34d613 (2026-03-04); vLLM maps both prefixes onto its own (see above).
MODELOPT_TENSORS = {
    "fc.weight": "fc.weight",
    "layers.0.self_attn.q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight": "midlayer.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight": "midlayer.mlp.down_proj.weight",
    "layers.0.hidden_norm.weight": "midlayer.hidden_norm.weight",
    "layers.0.input_layernorm.weight": "midlayer.input_layernorm.weight",
    "layers.0.post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "d2t": "d2t",
}
# Before a34d613: github.com/NVIDIA/TensorRT-Model-Optimizer at 5a4242f (2025-12-05),
# modelopt/torch/export/plugins/hf_spec_export.py: EAGLE_MODELOPT_TO_OFFICIAL (l. 21-39) renamed the draft module's
# names (layers.0.*, hidden_norm, input_embeds_norm, eagle_lm_head) to these, and export_spec_ckpt_state_dict
# (l. 59-81) wrote them (modelopt/torch/export/unified_export_hf.py, l. 576: model.safetensors).
MODELOPT_2025_TENSORS = {
    "midlayer.self_attn.q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight": "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight": "midlayer.mlp.down_proj.weight",
    "midlayer.hidden_norm.weight": "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight": "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "norm.weight": "norm.weight",
    "fc.weight": "fc.weight",
    "d2t": "d2t",
    "lm_head.weight": "lm_head.weight",
}

# Official EAGLE-1, github.com/SafeAILab/EAGLE at cb7e084 (2026-02-19):
# * eagle/model/cnets1.py: Model.__init__ (l. 472-528) registers embed_tokens (l. 480), one LlamaDecoderLayer per
#   layer as layers (l. 523) and fc = Linear(2 x hidden, hidden, bias=bias) (l. 524); no final norm, no lm_head.
#   LlamaDecoderLayer.__init__ (l. 393-401): self_attn, mlp, post_attention_layernorm, and an input_layernorm only
#   when index != 0; LlamaAttention.__init__ (l. 209-217): q_proj, k_proj, v_proj, o_proj; LlamaMLP.__init__
#   (l. 347-349): gate_proj, up_proj, down_proj.
# * eagle/train/main.py builds Model(config, load_emb=True) (l. 322: the base's embedding) and saves it whole with
#   accelerator.save_state (l. 469); eagle/model/ea_model.py builds fc with a bias unless config.json says
#   "bias": false (l. 48-54) and reads pytorch_model.bin, else model.safetensors (l. 122-134).
# Engines: SGLang python/sglang/srt/models/llama_eagle.py (at 034b3be: LlamaForCausalLMEagle, layer 0 without
# input_layernorm, fc with a bias); vLLM vllm/model_executor/models/llama_eagle.py (at 00da923: EagleLlamaForCausalLM,
# the same names, fc without a bias, embed_tokens skipped).
EAGLE1_TENSORS = {
    "embed_tokens.weight": EMBEDDING,
    "layers.0.self_attn.q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight": "midlayer.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight": "midlayer.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "fc.weight": "fc.weight",
}


def _tensors(table: dict[str, str], head: EagleHead, base=None) -> dict[str, torch.Tensor]:
    """What a project writes for ``head``: the table's names, the values of the specheads tensors in their roles."""
    own = head.state_dict()
    return {
        name: base.get_input_embeddings().weight if role == EMBEDDING else own[role] for name, role in table.items()
    }


def _specforge_config(head: EagleHead) -> dict:
    """configs/llama3-8B-eagle3.json's keys (the draft config SpecForge trains with and save_pretrained writes back),
    with the rope fields its export has under transformers 5: rope_parameters, mirrored to a top-level rope_theta by
    apply_legacy_rope_scaling (specforge/export/checkpoint_io.py, l. 32-59). No feature layers: SpecForge then
    captures [1, L // 2 - 1, L - 4] (specforge/algorithms/model_providers.py, resolve_eagle_capture_layers, l. 204),
    the layers whose outputs SGLang captures by default."""
    c = head.config
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
        "model_type": "llama",
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "num_hidden_layers": 1,
        "pad_token_id": 0,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "use_cache": True,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_parameters["rope_theta"]},
        "rope_theta": c.rope_parameters["rope_theta"],
    }


def _modelopt_config(head: EagleHead, version: int = 2026) -> dict:
    """The keys of ModelOpt's template (2026: modelopt/torch/export/plugins/hf_spec_configs.py,
    llama_eagle_template_config, l. 18-56; 2025: hf_spec_export.py, export_spec_ckpt_config, l. 89-124), filled as
    its exporter fills them from an EAGLE-3 draft: use_aux_hidden_state and use_last_layernorm on
    (modelopt/torch/speculative/config.py, l. 44), the rest from eagle/default_config.py (l. 18-45: rope_scaling
    with rope_theta, use_input_layernorm_in_first_layer, use_mtp_layernorm, parallel_draft_*). Its feature layers
    are default_eagle_aux_layer_ids (plugins/hf_eagle.py, l. 58-63: sorted {1, L // 2 - 1, L - 4}), the ids of
    decoder layers whose output a forward hook captures (l. 406), SGLang's convention: [1, 3, 4] on 8 layers."""
    c = head.config
    rope_theta = c.rope_parameters["rope_theta"]
    eagle_config = {
        "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
        "use_aux_hidden_state": True,
        "use_input_layernorm_in_first_layer": True,
        "use_last_layernorm": True,
        "use_mtp_layernorm": False,
    }
    if version == 2026:
        eagle_config.update(next_layer_regular=True, parallel_draft_step=1, parallel_draft_heads_num_layers=1)
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.01,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
        "model_type": "llama",
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "num_hidden_layers": 1,
        "pad_token_id": 0,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "use_cache": True,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "rope_scaling": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": c.head_dim,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "rope_theta": rope_theta,
        "eagle_config": eagle_config,
    }


def _eagle1_config(head: EagleHead) -> dict:
    """The keys of the official repository's EAGLE-1 configs: eagle/train/llama_2_chat_7B_config.json for a head
    with an fc bias (no "bias" key: ea_model.py then builds fc with one), eagle/train/EAGLE-LLaMA3-Instruct-8B
    (pad_token_id, rope_theta, "bias": false) for one without. The plain LlamaForCausalLM architecture, no head_dim
    (cnets1.py's LlamaAttention uses hidden_size // num_attention_heads, l. 199), no feature layers."""
    c = head.config
    config = {
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
        "model_type": "llama",
        "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": 1,
        "num_key_value_heads": c.num_key_value_heads,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.32.0.dev0",
        "use_cache": True,
        "vocab_size": c.vocab_size,
    }
    if c.fc_bias:
        return {**config, "pretraining_tp": 1, "rope_scaling": None}
    return {**config, "pad_token_id": 0, "rope_theta": c.rope_parameters["rope_theta"], "bias": False}


def _write(directory, config: dict, tensors: dict, weights: str = "model.safetensors") -> str:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(directory / weights))
    return str(directory)


def _decode(base, heads, **kwargs) -> list:
    """Per prompt, the accepted lengths and every drafted token tree, after checking each output against the base's
    own greedy decoding (the drafted tokens make the comparison matter even where little is accepted)."""
    decoder = SpecDecoder.from_pretrained(base, heads=heads)
    drafted, propose = [], decoder.drafter.propose

    def recording(state, request):
        proposal = propose(state, request)
        rows = proposal if isinstance(proposal, list) else [proposal]
        drafted.append([None if row is None else row.tokens.tolist() for row in rows])
        return proposal

    decoder.drafter.propose = recording
    runs = []
    for prompt in PROMPTS:
        out = decoder.generate(prompt, max_new_tokens=24, **kwargs)
        assert torch.equal(out.sequences, greedy_reference(base, prompt, 24))
        runs.append((out.stats.accepted_lengths, list(drafted)))
        drafted.clear()
    return runs


def _longest(runs: list) -> int:
    return max(max(lengths) for lengths, _ in runs)


def _specforge(head: EagleHead, directory, base=None) -> str:
    """SpecForge's SGLang export (export_to_sglang); with ``base``, its HF export (export_to_hf: the embedding too)."""
    table = SPECFORGE_TENSORS if base is None else SPECFORGE_TO_HF_TENSORS
    return _write(directory, _specforge_config(head), _tensors(table, head, base))


def _modelopt(head: EagleHead, directory, version: int = 2026) -> str:
    """ModelOpt's EAGLE-3 export: layers.0.* since 2026, midlayer.* before; d2t without t2d either way."""
    table = MODELOPT_TENSORS if version == 2026 else MODELOPT_2025_TENSORS
    return _write(directory, _modelopt_config(head, version), _tensors(table, head))


def _official_eagle1(head: EagleHead, base, directory) -> str:
    """The official repository's EAGLE-1 checkpoint: fc.bias when its config has no "bias": false."""
    table = {**EAGLE1_TENSORS, "fc.bias": "fc.bias"} if head.config.fc_bias else EAGLE1_TENSORS
    return _write(directory, _eagle1_config(head), _tensors(table, head, base))


def _fasterdecoding(heads: MedusaHeads, directory) -> str:
    tensors = {}
    for h, blocks in enumerate(heads.blocks):
        tensors[f"{h}.0.linear.weight"] = blocks[0].linear.weight
        tensors[f"{h}.0.linear.bias"] = blocks[0].linear.bias
        if heads.lm_heads is not None:
            tensors[f"{h}.1.weight"] = heads.lm_heads[h].weight
    config = {"medusa_num_heads": 3, "medusa_num_layers": 1, "base_model_name_or_path": "org/base"}
    return _write(directory, config, tensors, "medusa_lm_head.safetensors")


FOREIGN = {
    "specforge-eagle3": ("eagle3", lambda t, base, d: _specforge(t["eagle3"], d)),
    "specforge-eagle3-to-hf": ("eagle3", lambda t, base, d: _specforge(t["eagle3"], d, base)),
    "modelopt-eagle3": ("eagle3", lambda t, base, d: _modelopt(t["eagle3"], d)),
    "modelopt-eagle3-2025": ("eagle3", lambda t, base, d: _modelopt(t["eagle3"], d, 2025)),
    "official-eagle1-llama2-chat": ("eagle1-bias", lambda t, base, d: _official_eagle1(t["eagle1-bias"], base, d)),
    "official-eagle1-llama3": ("eagle1", lambda t, base, d: _official_eagle1(t["eagle1"], base, d)),
    "fasterdecoding-medusa": ("medusa", lambda t, base, d: _fasterdecoding(t["medusa"], d)),
    "tgi-v2-medusa": ("medusa-shared", lambda t, base, d: _fasterdecoding(t["medusa-shared"], d)),
}


@pytest.mark.parametrize("layout", FOREIGN)
def test_foreign_checkpoints_decode_losslessly_and_draft_as_the_originals(base, trained, tmp_path, layout) -> None:
    kind, write = FOREIGN[layout]
    directory = write(trained, base, tmp_path / "heads")
    with pytest.warns(UserWarning, match="without a fingerprint of its base: only its shapes were checked"):
        loaded = load_heads(directory, base)
    original = trained[kind]
    assert head_type_of(loaded).name == head_type_of(original).name
    if isinstance(original, EagleHead):
        assert loaded.config.layer_ids == original.config.layer_ids
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported = _decode(base, directory)
    native = _decode(base, original)
    assert imported == native
    if isinstance(original, EagleHead):  # trained EAGLE heads draft well enough for multi-token commits here
        assert _longest(native) >= 3


@pytest.mark.parametrize(
    ("format", "kind", "tree"),
    [
        ("eagle3", "eagle3", "dynamic"),
        ("eagle3", "eagle3-full", "chain-3"),
        ("speculators", "eagle3", "binary-7"),
        ("eagle", "eagle1", "dynamic"),
        ("eagle", "eagle1-bias", "chain-3"),
        ("medusa", "medusa", "binary-7"),
        ("medusa", "medusa-shared", "chain-2"),
    ],
)
def test_export_then_import_drafts_exactly_as_before(base, trained, tmp_path, format, kind, tree) -> None:
    export_heads(trained[kind], tmp_path / "out", format, base_model=base)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exports carry specheads' record of the base: checked, no warning
        imported = _decode(base, str(tmp_path / "out"), tree=tree)
    native = _decode(base, trained[kind], tree=tree)
    assert imported == native
    if isinstance(trained[kind], EagleHead):
        assert _longest(native) >= 2


def test_an_export_loaded_on_another_base_fails_its_fingerprint(base, trained, tmp_path) -> None:
    export_heads(trained["eagle3"], tmp_path / "out", "eagle3", base_model=base)
    other = tiny_model("llama", seed=7, vocab_size=VOCAB, layers=8)
    with pytest.raises(HeadCheckpointError, match="another base model: base_model.fingerprint"):
        load_heads(tmp_path / "out", other)


# ---------------------------------------------------------------------------------------------- bad input
def test_a_foreign_checkpoint_needs_its_base(trained, tmp_path) -> None:
    directory = _specforge(trained["eagle3"], tmp_path / "heads")
    with pytest.raises(HeadCheckpointError, match="records no fingerprint of its base: load it with its base"):
        load_heads(directory)


def test_shapes_are_checked_against_the_base(trained, tmp_path) -> None:
    wider = tiny_model("llama", vocab_size=VOCAB, hidden=64, layers=8)
    with pytest.raises(HeadCheckpointError, match="another base: the hidden size is 32 there but 64"):
        load_heads(_specforge(trained["eagle3"], tmp_path / "a"), wider)
    larger = tiny_model("llama", vocab_size=128, layers=8)
    with pytest.raises(HeadCheckpointError, match="the vocabulary size is 96 there but 128"):
        load_heads(_specforge(trained["eagle3"], tmp_path / "b"), larger)
    shallow = tiny_model("llama", vocab_size=VOCAB, layers=4)
    with pytest.raises(HeadCheckpointError, match=r"layer_ids \[2, 4, 5\].*4 layers"):
        load_heads(_modelopt(trained["eagle3"], tmp_path / "c"), shallow)
    with pytest.raises(HeadCheckpointError, match="another base: the hidden size"):
        load_heads(_fasterdecoding(trained["medusa"], tmp_path / "d"), wider)


def test_an_embedding_from_another_base_is_refused(base, trained, tmp_path) -> None:
    directory = _official_eagle1(
        trained["eagle1"], tiny_model("llama", seed=9, vocab_size=VOCAB, layers=8), tmp_path / "h"
    )
    with pytest.raises(HeadCheckpointError, match="embed_tokens that differs from this base's"):
        load_heads(directory, base)


def test_pickled_sharded_and_corrupt_foreign_checkpoints(base, trained, tmp_path) -> None:
    directory = tmp_path / "pickled"
    _specforge(trained["eagle3"], directory.parent / "pickled")
    (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    with pytest.raises(HeadCheckpointError, match="pickle-based file; specheads never unpickles"):
        load_heads(directory, base)
    corrupt = tmp_path / "corrupt"
    _specforge(trained["eagle3"], corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x12" * 64)
    with pytest.raises(HeadCheckpointError):
        load_heads(corrupt, base)
    medusa = tmp_path / "medusa"
    _fasterdecoding(trained["medusa"], medusa)
    (medusa / "medusa_lm_head.safetensors").rename(medusa / "medusa_lm_head.pt")
    with pytest.raises(HeadCheckpointError, match="medusa_lm_head.pt is a pickle-based file"):
        load_heads(medusa, base)


def test_unsupported_draft_variants_are_named(base, trained, tmp_path) -> None:
    head = trained["eagle3"]
    config, tensors = _specforge_config(head), _tensors(SPECFORGE_TENSORS, head)
    _write(tmp_path / "two", {**config, "num_hidden_layers": 2}, tensors)
    with pytest.raises(HeadCheckpointError, match="more than one layer"):
        load_heads(tmp_path / "two", base)
    _write(tmp_path / "aux", {**config, "use_aux_norm": True}, tensors)
    with pytest.raises(HeadCheckpointError, match="use_aux_norm=true drafts are not supported"):
        load_heads(tmp_path / "aux", base)
    _write(tmp_path / "norm", {**config, "norm_before_fc": True}, tensors)  # the flag without its norm
    with pytest.raises(HeadCheckpointError, match="input_norm"):
        load_heads(tmp_path / "norm", base)
    nvidia = {
        **config,
        "eagle_config": {**config.get("eagle_config", {}), "norm_before_fc": True},
    }  # where NVIDIA's are
    width = 3 * head.config.hidden_size
    _write(tmp_path / "nvidia", nvidia, {**tensors, "input_norm.weight": torch.linspace(0.5, 1.5, width)})
    loaded = load_heads(tmp_path / "nvidia", base)
    assert loaded.config.norm_before_fc and torch.equal(loaded.input_norm.weight, torch.linspace(0.5, 1.5, width))
    export_heads(head, tmp_path / "spec", "speculators", base_model=base)
    spec = json.loads((tmp_path / "spec" / "config.json").read_text())
    spec["transformer_layer_config"]["model_type"] = "qwen3"
    (tmp_path / "spec" / "config.json").write_text(json.dumps(spec))
    with pytest.raises(HeadCheckpointError, match="a qwen3 draft layer"):
        load_heads(tmp_path / "spec", base)
    _write(tmp_path / "extra", {**config}, {**tensors, "mask_hidden": torch.zeros(3)})
    with pytest.raises(HeadCheckpointError, match="unexpected \\['mask_hidden'\\]"):
        load_heads(tmp_path / "extra", base)
