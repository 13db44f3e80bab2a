"""Block drafters in the engines' layouts: ``dflash`` (z-lab's native DFlash: vLLM, SGLang, TensorRT-LLM, llama.cpp,
the ``dflash`` package), ``dspark`` (DeepSpec's native DSpark: vLLM, SGLang, llama.cpp) and ``speculators`` (vLLM's
speculators format, ``speculators_model_type: dflash | dspark``). Each is written, read back, checked against its
engines' loading rules and recognised here.

What every layout shares: the Qwen3 draft-layer config (``model_type: qwen3``, ``layer_types`` all
``full_attention``, not causal: bidirectional inside the block, as trained), ``rope_parameters`` and ``rope_theta``
written (vLLM assumes theta 1e6 when they are absent), the full vocabulary (no ``embed_tokens`` or ``lm_head``
tensors: every engine shares the target's) and exactly the drafter's state dict as tensors (vLLM raises on a name it
does not know). Feature layers: ``aux_hidden_state_layer_ids`` (speculators) are ``hidden_states`` indices, the
native ``target_layer_ids`` are one less (layer i's output is ``hidden_states[i + 1]``).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from transformers import PreTrainedModel

from specheads.methods.api import (
    SAFETENSORS_WEIGHTS,
    SPECULATORS_VERSION,
    CheckReport,
    EngineVerdict,
    ExportFormat,
    FolderContents,
    FolderReader,
    base_layer_shape,
    config_architectures,
    id_list,
    serving_engines,
    shape_error,
    tensor_problems,
    unknown_tensors,
    vocab_size,
)
from specheads.methods.dflash.heads import DFlashConfig, DFlashHead

DFLASH_ARCHITECTURE = "DFlashDraftModel"
DSPARK_ARCHITECTURES = ("Qwen3DSparkModel", "DSparkDraftModel")
SPECULATORS_ARCHITECTURES = {"dflash": "DFlashDraftModel", "dspark": "DSparkDraftModel"}
NUM_ANCHORS = 512  # DeepSpec's training recipe field (its loader requires it; nothing serves by it)
LAYER_KEYS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)


# ================================================================================================ write
def _check_variant(head: Any, format: str, variants: tuple[str, ...]) -> DFlashHead:
    if not isinstance(head, DFlashHead):
        family = getattr(head, "family", type(head).__name__)
        raise ValueError(f"the {format} format holds block drafters ({', '.join(variants)}); these are {family} heads")
    if head.config.variant not in variants:
        raise ValueError(f"the {format} format holds {' or '.join(variants)} heads; these are {head.config.variant}")
    return head


def qwen3_config(config: DFlashConfig) -> dict[str, Any]:
    """The Qwen3 config of the draft layers, as every layout writes it."""
    rope = dict(config.rope_parameters)
    return {
        "model_type": "qwen3",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": rope,
        "rope_theta": float(rope.get("rope_theta", 10000.0)),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * config.num_layers,
    }


def _base_layers(head: DFlashHead, base: PreTrainedModel | None) -> int:
    layers = int(head.config.base_model.get("num_hidden_layers") or 0)
    if base is not None:
        layers = int(getattr(base.config, "num_hidden_layers", 0) or layers)
    if not layers:
        raise ValueError("the base's layer count is unknown: pass the base (--base)")
    return layers


def _state(head: DFlashHead) -> dict[str, torch.Tensor]:
    return dict(head.state_dict())


def _native_commands(head: DFlashHead, name: str) -> dict[str, str]:
    block, base = head.config.block_size, name or "<base>"
    if head.config.variant == "dflash":
        spec = json.dumps({"method": "dflash", "model": "{out}", "num_speculative_tokens": block - 1})
        return {
            "vllm": f"vllm serve {base} --speculative-config '{spec}' --attention-backend FLASH_ATTN",
            "sglang": f"python -m sglang.launch_server --model-path {base} --speculative-algorithm DFLASH "
            f"--speculative-draft-model-path {{out}} --speculative-num-draft-tokens {block}",
            "llama.cpp": "convert {out} with llama.cpp's convert_hf_to_gguf.py, then llama-server -m <base.gguf> "
            f"-md draft.gguf --spec-type draft-dflash --spec-draft-n-max {block - 1}",
        }
    spec = json.dumps({"method": "dspark", "model": "{out}", "num_speculative_tokens": block})
    return {
        "vllm": f"VLLM_USE_V2_MODEL_RUNNER=1 vllm serve {base} --speculative-config '{spec}'",
        "sglang": f"python -m sglang.launch_server --model-path {base} --speculative-algorithm DSPARK "
        f"--speculative-draft-model-path {{out}} --speculative-num-draft-tokens {block + 1}",
        "llama.cpp": "convert {out} with llama.cpp's convert_hf_to_gguf.py, then llama-server -m <base.gguf> "
        f"-md draft.gguf --spec-type draft-dspark --spec-draft-n-max {block}",
    }


def _dspark_fields(config: DFlashConfig) -> dict[str, Any]:
    return {
        "markov_rank": config.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": config.confidence_head,
        "confidence_head_with_markov": True,
    }


def _write_dflash(
    head: Any, base: PreTrainedModel | None, name: str, engines: list[str] | None, steps: int | None
) -> FolderContents:
    head = _check_variant(head, "dflash", ("dflash",))
    serving_engines(engines, {"vllm": "", "sglang": "", "llama.cpp": "", "dflash": ""}, "dflash")
    layers = _base_layers(head, base)
    config = {
        "architectures": [DFLASH_ARCHITECTURE],
        **qwen3_config(head.config),
        "is_causal": False,
        "num_target_layers": layers,
        "block_size": head.config.block_size,
        "dflash_config": {
            "mask_token_id": head.config.mask_token_id,
            "target_layer_ids": [i - 1 for i in head.config.layer_ids],
            "block_size": head.config.block_size,
        },
    }
    notes = [f"num_speculative_tokens: vLLM {head.config.block_size - 1}, SGLang's draft tokens "
             f"{head.config.block_size} (the block)"]  # fmt: skip
    return config, _state(head), _native_commands(head, name), notes


def _write_dspark(
    head: Any, base: PreTrainedModel | None, name: str, engines: list[str] | None, steps: int | None
) -> FolderContents:
    head = _check_variant(head, "dspark", ("dspark",))
    serving_engines(engines, {"vllm": "", "sglang": "", "llama.cpp": ""}, "dspark")
    config = {
        "architectures": [DSPARK_ARCHITECTURES[0]],
        **qwen3_config(head.config),
        "is_causal": False,
        "num_target_layers": _base_layers(head, base),
        "block_size": head.config.block_size,
        "mask_token_id": head.config.mask_token_id,
        "target_layer_ids": [i - 1 for i in head.config.layer_ids],
        "num_anchors": NUM_ANCHORS,
        "sample_from_anchor": True,
        **_dspark_fields(head.config),
    }
    notes = [f"num_speculative_tokens: vLLM {head.config.block_size}, SGLang's draft tokens "
             f"{head.config.block_size + 1} (the block and the bonus)"]  # fmt: skip
    return config, _state(head), _native_commands(head, name), notes


def _write_speculators(
    head: Any, base: PreTrainedModel | None, name: str, engines: list[str] | None, steps: int | None
) -> FolderContents:
    head = _check_variant(head, "speculators", ("dflash", "dspark"))
    if base is None:
        raise ValueError("the speculators format names its verifier: pass the base (--base)")
    serving_engines(engines, {"vllm": "", "speculators": ""}, "speculators")
    variant, config_ = head.config.variant, head.config
    drafts = config_.num_drafts
    config = {
        "speculators_model_type": variant,
        "speculators_version": SPECULATORS_VERSION,
        "architectures": [SPECULATORS_ARCHITECTURES[variant]],
        "transformer_layer_config": qwen3_config(config_),
        "draft_vocab_size": config_.vocab_size,
        "block_size": config_.block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": list(config_.layer_ids),
        "mask_token_id": config_.mask_token_id,
        "sliding_window_non_causal": True,  # else vLLM serves the (bidirectional) full-attention layers causally
        "sample_from_anchor": config_.sample_from_anchor,  # written: vLLM's default for dspark is false
        "tie_word_embeddings": False,
        "speculators_config": {
            "algorithm": variant,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": drafts,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],  # fmt: skip
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": name or None,
                "architectures": list(base.config.architectures or [type(base).__name__]),
            },
        },
    }
    if variant == "dspark":
        config.update(_dspark_fields(config_))
    spec = json.dumps({"model": "{out}", "num_speculative_tokens": drafts})
    runner = "VLLM_USE_V2_MODEL_RUNNER=1 " if variant == "dspark" else ""
    commands = {"vllm": f"{runner}vllm serve {name or '<base>'} --speculative-config '{spec}'"}
    notes = ["load in Python with speculators: SpeculatorModel.from_pretrained(out) (the verifier path must load)"]
    return config, _state(head), commands, notes


# ================================================================================================ read
def _layer_config(config: dict[str, Any], format: str) -> dict[str, Any]:
    layer = config.get("transformer_layer_config") if format == "speculators" else config
    if not isinstance(layer, dict):
        raise ValueError("transformer_layer_config must be a dict")
    return layer


def _layout_fields(config: dict[str, Any], format: str) -> dict[str, Any]:
    """variant, layer_ids (hidden_states indices), block_size, mask_token_id, markov_rank, confidence_head."""
    if format == "speculators":
        variant = config.get("speculators_model_type")
        ids = id_list(config.get("aux_hidden_state_layer_ids"), "aux_hidden_state_layer_ids")
        mask, block = config.get("mask_token_id"), config.get("block_size", 8)
    elif format == "dflash":
        variant = "dflash"
        inner = config.get("dflash_config") or {}
        target = id_list(inner.get("target_layer_ids", config.get("target_layer_ids")), "target_layer_ids")
        ids = None if target is None else [i + 1 for i in target]
        mask = inner.get("mask_token_id", config.get("mask_token_id"))
        block = inner.get("block_size", config.get("block_size", 16))
    else:
        variant = "dspark"
        target = id_list(config.get("target_layer_ids"), "target_layer_ids")
        ids = None if target is None else [i + 1 for i in target]
        mask, block = config.get("mask_token_id"), config.get("block_size", 8)
    if variant not in ("dflash", "dspark"):
        raise ValueError(f"speculators model type {variant!r}; a block drafter is dflash or dspark")
    if ids is None:
        raise ValueError("the config names no feature layers (aux_hidden_state_layer_ids / target_layer_ids)")
    if mask is None:
        raise ValueError("the config names no mask_token_id")
    fields = {"variant": variant, "layer_ids": ids, "block_size": block, "mask_token_id": mask}
    if variant == "dspark":
        fields["markov_rank"] = config.get("markov_rank", 256)
        fields["confidence_head"] = bool(config.get("enable_confidence_head", True))
    return fields


def _read(format: str) -> FolderReader:
    def read(config: dict[str, Any], tensors: dict[str, torch.Tensor], base: PreTrainedModel, where: str) -> Any:
        from specheads.methods.api import base_model_info, load_module_state

        layer = _layer_config(config, format)
        fields = _layout_fields(config, format)
        shape = base_layer_shape(base)
        hidden, vocab = int(layer.get("hidden_size", 0)), int(layer.get("vocab_size", vocab_size(base)))
        if hidden != shape["hidden_size"]:
            raise shape_error(where, "hidden_size", hidden, shape["hidden_size"])
        if vocab != vocab_size(base):
            raise shape_error(where, "vocab_size", vocab, vocab_size(base))
        if format == "speculators" and config.get("draft_vocab_size", vocab) != vocab:
            raise ValueError("a reduced draft vocabulary: specheads reads full-vocabulary block drafters only")
        rope = layer.get("rope_parameters") or {"rope_type": "default", "rope_theta": layer.get("rope_theta", 1e6)}
        head_config = DFlashConfig(
            hidden_size=hidden,
            vocab_size=vocab,
            num_attention_heads=int(layer["num_attention_heads"]),
            num_key_value_heads=int(layer.get("num_key_value_heads") or layer["num_attention_heads"]),
            head_dim=int(layer.get("head_dim") or hidden // int(layer["num_attention_heads"])),
            intermediate_size=int(layer["intermediate_size"]),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_parameters=dict(rope),
            max_position_embeddings=int(layer.get("max_position_embeddings", shape["max_position_embeddings"])),
            num_layers=int(layer["num_hidden_layers"]),
            base_model=base_model_info(base),
            **fields,
        )
        if head_config.confidence_head and "confidence_head.proj.weight" not in tensors:
            head_config.confidence_head = False  # vLLM drops a confidence head whose tensors are absent
        head = DFlashHead(head_config)
        load_module_state(head, tensors, where)
        return head

    return read


# ================================================================================================ check
def _expected_tensors(layer: dict[str, Any], features: int, variant: str, rank: int, confidence: bool,
                      vocab: int) -> dict[str, tuple[int, ...]]:  # fmt: skip
    hidden, heads = int(layer["hidden_size"]), int(layer["num_attention_heads"])
    kv, head_dim = int(layer.get("num_key_value_heads") or heads), int(layer.get("head_dim") or hidden // heads)
    inner = int(layer["intermediate_size"])
    expected = {"fc.weight": (hidden, features * hidden), "hidden_norm.weight": (hidden,), "norm.weight": (hidden,)}
    shapes = {
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (heads * head_dim, hidden),
        "self_attn.k_proj.weight": (kv * head_dim, hidden),
        "self_attn.v_proj.weight": (kv * head_dim, hidden),
        "self_attn.o_proj.weight": (hidden, heads * head_dim),
        "self_attn.q_norm.weight": (head_dim,),
        "self_attn.k_norm.weight": (head_dim,),
        "mlp.gate_proj.weight": (inner, hidden),
        "mlp.up_proj.weight": (inner, hidden),
        "mlp.down_proj.weight": (hidden, inner),
    }
    for index in range(int(layer["num_hidden_layers"])):
        expected.update({f"layers.{index}.{key}": shape for key, shape in shapes.items()})
    if variant == "dspark":
        expected["markov_head.markov_w1.weight"] = (vocab, rank)
        expected["markov_head.markov_w2.weight"] = (vocab, rank)
        if confidence:
            expected["confidence_head.proj.weight"] = (1, hidden + rank)
            expected["confidence_head.proj.bias"] = (1,)
    return expected


def _common_problems(config: dict[str, Any], layer: dict[str, Any], tensors: dict[str, torch.Tensor],
                     fields: dict[str, Any], layers: int | None) -> list[str]:  # fmt: skip
    problems = []
    vocab = int(layer.get("vocab_size", 0))
    if layer.get("model_type") != "qwen3":
        problems.append(f"model_type {layer.get('model_type')!r}: the engines build block drafters as qwen3 layers")
    if "rope_parameters" not in layer and "rope_theta" not in layer:
        problems.append("no rope_parameters / rope_theta: vLLM assumes rope theta 1e6")
    types = layer.get("layer_types") or ["full_attention"] * int(layer.get("num_hidden_layers", 0))
    if any(t != "full_attention" for t in types):
        problems.append(f"layer_types {types}: specheads trains full attention, bidirectional inside the block")
    if layer.get("is_causal") is True:
        problems.append("is_causal is true: the engines would serve the block causally, unlike its training")
    mask = fields["mask_token_id"]
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 <= mask < vocab:
        problems.append(f"mask_token_id {mask!r} is not an id of the {vocab}-token target vocabulary")
    ids = fields["layer_ids"]
    if ids != sorted(set(ids)) or min(ids) < 1 or (layers and max(ids) > layers - 1):
        problems.append(f"feature layers (hidden_states ids) {ids}: distinct, ascending, in [1, {(layers or 0) - 1}] "
                        "(SGLang cannot capture the embeddings or the last layer's output)")  # fmt: skip
    block = fields["block_size"]
    if not isinstance(block, int) or block < 2:
        problems.append(f"block_size {block!r}: a block is the anchor and at least one mask")
    variant = fields["variant"]
    rank = int(fields.get("markov_rank", 0) or 0)
    if variant == "dspark":
        if config.get("markov_head_type", "vanilla") != "vanilla":
            problems.append(f"markov_head_type {config.get('markov_head_type')!r}: vLLM builds only the vanilla "
                            "Markov head (gated / rnn tensors would raise)")  # fmt: skip
        if rank < 1:
            problems.append(f"markov_rank {rank}: DSpark needs a Markov head (rank >= 1)")
    confidence = variant == "dspark" and bool(fields.get("confidence_head"))
    expected = _expected_tensors(layer, len(ids), variant, rank, confidence, vocab)
    problems += tensor_problems(tensors, expected, {})
    stray = unknown_tensors(tensors, set(expected))
    if stray:
        problems.append(f"tensors no engine knows {stray[:6]} (vLLM raises on unknown names; the full-vocabulary "
                        "embedding and lm_head come from the target)")  # fmt: skip
    return problems


def _check_dflash(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    fields = _layout_fields(config, "dflash")
    layers = config.get("num_target_layers")
    report.problems += _common_problems(config, config, tensors, fields, layers)
    engines = []
    if DFLASH_ARCHITECTURE not in config_architectures(config):
        report.problems.append(f"architectures {config_architectures(config)}: vLLM and SGLang look for "
                               f"{DFLASH_ARCHITECTURE}")  # fmt: skip
    sglang = []
    if not isinstance(layers, int):
        sglang.append("num_target_layers is missing: SGLang validates target_layer_ids against it")
    if "dflash_config" not in config:
        engines.append("no dflash_config: the engines read mask_token_id and target_layer_ids from it")
    report.verdicts += [
        EngineVerdict("vllm", True, list(engines), note="num_speculative_tokens on the command line"),
        EngineVerdict("sglang", True, engines + sglang, note="verifies the block as a chain (top-k 1)"),
        EngineVerdict("llama.cpp", True, list(engines), note="--spec-type draft-dflash after convert_hf_to_gguf.py"),
        EngineVerdict("dflash", True, list(engines), note="z-lab's reference: DFlashDraftModel.from_pretrained"),
    ]


def _check_dspark(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    fields = _layout_fields(config, "dspark")
    report.problems += _common_problems(config, config, tensors, fields, config.get("num_target_layers"))
    if not any(a in DSPARK_ARCHITECTURES for a in config_architectures(config)):
        report.problems.append(f"architectures {config_architectures(config)}: vLLM and SGLang look for "
                               f"{DSPARK_ARCHITECTURES[0]}")  # fmt: skip
    sglang, vllm = [], []
    if "markov_head_type" not in config:
        sglang.append("markov_head_type is missing: SGLang requires it")
    if config.get("sample_from_anchor", True) is not True:
        sglang.append("sample_from_anchor is false: DSpark's slots all predict (its layout)")
        vllm.append("sample_from_anchor is false: DSpark's slots all predict (its layout)")
    has_confidence = "confidence_head.proj.weight" in tensors
    if config.get("enable_confidence_head", True) and not has_confidence:
        sglang.append("enable_confidence_head is set but the confidence tensors are missing: SGLang raises")
    if "num_anchors" not in config:
        report.problems.append("num_anchors is missing: DeepSpec's loader requires it")
    report.verdicts += [
        EngineVerdict("vllm", True, vllm, note="V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1)"),
        EngineVerdict("sglang", True, sglang, note="verifies the block as a chain"),
        EngineVerdict("llama.cpp", True, [], note="--spec-type draft-dspark after convert_hf_to_gguf.py"),
    ]


def _check_speculators(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    fields = _layout_fields(config, "speculators")
    layer = _layer_config(config, "speculators")
    report.problems += _common_problems(config, layer, tensors, fields, None)
    vllm = []
    if config.get("sliding_window_non_causal") is not True:
        vllm.append("sliding_window_non_causal is not true: vLLM serves every draft layer causally "
                    "(a silent acceptance loss for bidirectional drafters)")  # fmt: skip
    if "sample_from_anchor" not in config:
        vllm.append("sample_from_anchor is not written: vLLM defaults it to false, speculators' dspark to true")
    elif bool(config["sample_from_anchor"]) != (fields["variant"] == "dspark"):
        vllm.append(f"sample_from_anchor {config['sample_from_anchor']} for {fields['variant']}: DFlash's slot 0 is "
                    "the anchor (false), DSpark's slots all predict (true)")  # fmt: skip
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    if "name_or_path" not in verifier:
        vllm.append("speculators_config.verifier.name_or_path is missing: vLLM requires the key")
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    drafts = fields["block_size"] - (0 if fields["variant"] == "dspark" else 1)
    if methods[0].get("speculative_tokens") != drafts:
        vllm.append(f"proposal_methods[0].speculative_tokens {methods[0].get('speculative_tokens')!r}: one block "
                    f"drafts {drafts}")  # fmt: skip
    if config.get("draft_vocab_size", layer.get("vocab_size")) != layer.get("vocab_size"):
        vllm.append("a reduced draft vocabulary needs lm_head and d2t tensors, which specheads does not write")
    report.verdicts += [
        EngineVerdict("vllm", True, vllm),
        EngineVerdict("speculators", True, [], note="SpeculatorModel.from_pretrained (the verifier path must load)"),
    ]


# ================================================================================================ recognise
def _speculators_type(config: dict[str, Any]) -> str | None:
    return config.get("speculators_model_type")


FORMATS = {
    "dflash": ExportFormat(
        "dflash",
        SAFETENSORS_WEIGHTS,
        write=_write_dflash,
        read=_read("dflash"),
        check=_check_dflash,
        detect=lambda config, names: (
            _speculators_type(config) is None and DFLASH_ARCHITECTURE in config_architectures(config)
        ),
    ),
    "dspark": ExportFormat(
        "dspark",
        SAFETENSORS_WEIGHTS,
        write=_write_dspark,
        read=_read("dspark"),
        check=_check_dspark,
        detect=lambda config, names: (
            _speculators_type(config) is None and any(a in DSPARK_ARCHITECTURES for a in config_architectures(config))
        ),
    ),
    "speculators": ExportFormat(
        "speculators",
        SAFETENSORS_WEIGHTS,
        write=_write_speculators,
        read=_read("speculators"),
        check=_check_speculators,
        detect=lambda config, names: _speculators_type(config) in ("dflash", "dspark"),
    ),
}
