"""Replay the serving engines' loading rules on an exported head directory.

The engines are lenient in different, silent ways (SGLang skips unknown tensor names without a word, speculators
leaves a missing ``embed_tokens`` uninitialised, vLLM leaves a missing ``d2t`` at zero and drops every ``.bias`` it
has no parameter for), so a directory that "loads" can still serve garbage. :func:`check_export` names every such
problem per engine. Which engines a directory is meant for comes from its format and its ``architectures``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from specheads.export.layouts import (
    CONFIG_NAME,
    EAGLE_WEIGHTS,
    MEDUSA_WEIGHTS,
    draft_map_problems,
    eagle1_shapes,
    eagle3_shapes,
    llama_geometry,
    medusa_shapes,
    vllm_layer_ids,
)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SGLANG_EAGLE1 = "LlamaForCausalLMEagle"
VLLM_EAGLE1 = ("EagleLlamaForCausalLM", "LlamaForCausalLM")


@dataclass
class EngineVerdict:
    """One engine's view of a directory: whether the directory targets it, and what would go wrong there."""

    engine: str
    targeted: bool
    problems: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def loads(self) -> bool:
        return self.targeted and not self.problems


@dataclass
class CheckReport:
    """The result of :func:`check_export`: shared problems (tensors, ids) and one verdict per engine."""

    directory: str
    format: str | None
    problems: list[str] = field(default_factory=list)
    verdicts: list[EngineVerdict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        targeted = [v for v in self.verdicts if v.targeted]
        return not self.problems and bool(targeted) and all(not v.problems for v in targeted)

    @property
    def engines(self) -> list[str]:
        """The engines that load this directory correctly."""
        return [v.engine for v in self.verdicts if v.loads] if not self.problems else []

    def all_problems(self) -> list[str]:
        problems = list(self.problems)
        for verdict in self.verdicts:
            problems += [f"{verdict.engine}: {p}" for p in verdict.problems if verdict.targeted]
        if not any(v.targeted for v in self.verdicts) and self.format is not None:
            problems.append("no serving engine is targeted by this directory (see the notes)")
        return problems

    def render(self) -> str:
        lines = [f"{self.directory}: {self.format or 'unknown'} layout"]
        lines += [f"  problem: {p}" for p in self.problems]
        for verdict in self.verdicts:
            if not verdict.targeted:
                lines.append(f"  {verdict.engine}: not targeted ({verdict.note})")
            elif verdict.problems:
                lines += [f"  {verdict.engine}: problem: {p}" for p in verdict.problems]
            else:
                lines.append(f"  {verdict.engine}: loads" + (f" ({verdict.note})" if verdict.note else ""))
        lines.append("ok" if self.ok else f"{len(self.all_problems())} problem(s)")
        return "\n".join(lines)


def detect_format(config: dict[str, Any], tensor_names: set[str] | None = None) -> str | None:
    """The layout a ``config.json`` (and, when the config is silent, its tensor names) belongs to."""
    if "head_type" in config and "specheads_version" in config:
        return "native"
    if "speculators_model_type" in config or "speculators_config" in config:
        return "speculators"
    if "medusa_num_heads" in config:
        return "medusa"
    architectures = [str(a) for a in config.get("architectures") or []]
    if any("Eagle3" in a for a in architectures):
        return "eagle3"
    if any("Eagle" in a for a in architectures):
        return "eagle"
    names = tensor_names or set()
    if {"fc.weight"} <= names and any(n.endswith("hidden_norm.weight") for n in names):
        return "eagle3"
    if {"fc.weight"} <= names:  # the official EAGLE-1 checkpoints name the plain LlamaForCausalLM architecture
        return "eagle"
    return None


def check_export(directory: str | Path, format: str | None = None) -> CheckReport:
    """Check ``directory`` against every engine's loading rules for its format (read from its config when None)."""
    directory = Path(directory)
    report = CheckReport(str(directory), format)
    config_path = directory / CONFIG_NAME
    if not directory.is_dir():
        report.problems.append(f"{directory} is not a directory")
        return report
    try:
        config = json.loads(config_path.read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        report.problems.append(f"{CONFIG_NAME} cannot be read: {error}")
        return report
    detected = detect_format(config, None)
    weights_name = MEDUSA_WEIGHTS if (format or detected) == "medusa" else EAGLE_WEIGHTS
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        report.problems.append(f"pickle files {pickles}: engines and specheads load safetensors; remove them")
    try:
        tensors = load_file(str(directory / weights_name))
    except FileNotFoundError:
        report.problems.append(f"no {weights_name}")
        return report
    except Exception as error:  # safetensors raises its own types for truncated or corrupt files
        report.problems.append(f"{weights_name} is not a readable safetensors file: {error}")
        return report
    detected = detect_format(config, set(tensors)) if detected is None else detected
    if format is None:
        report.format = format = detected
    elif detected is not None and detected != format:
        report.problems.append(f"the config is a {detected} config, not {format}")
        return report
    rules = {
        "eagle3": _check_eagle3,
        "speculators": _check_speculators,
        "eagle": _check_eagle1,
        "medusa": _check_medusa,
    }
    if format not in rules:
        report.problems.append(f"not a layout of a serving engine (known: {sorted(rules)})")
        return report
    try:
        rules[format](config, tensors, report)
    except (KeyError, TypeError, ValueError) as error:
        report.problems.append(f"{CONFIG_NAME} lacks or mangles a field the engines read: {error!r}")
    return report


# ---------------------------------------------------------------------------------------------- shared tensor rules
def _tensor_problems(
    tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], optional: dict[str, tuple[int, ...]]
) -> list[str]:
    problems = []
    for name, shape in expected.items():
        if name not in tensors:
            problems.append(f"missing tensor {name} {list(shape)} (no engine reports it; it would serve uninitialised)")
    float_dtypes = set()
    for name, tensor in tensors.items():
        shape = expected.get(name, optional.get(name))
        if shape is not None and tuple(tensor.shape) != tuple(shape):
            problems.append(f"{name} has shape {list(tensor.shape)}, the config implies {list(shape)}")
        if tensor.is_floating_point():
            float_dtypes.add(tensor.dtype)
    if len(float_dtypes) > 1:
        problems.append(f"weights in several dtypes {sorted(str(d) for d in float_dtypes)}")
    return problems


def _unknown(tensors: dict[str, torch.Tensor], known: set[str]) -> list[str]:
    return sorted(set(tensors) - known)


def _nonzero_bias(tensors: dict[str, torch.Tensor], name: str) -> bool:
    return name in tensors and bool(tensors[name].float().abs().max() > 0)


def _ids(value: Any, what: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ValueError(f"{what} must be a list of integers, got {value!r}")
    return value


def _architectures(config: dict[str, Any]) -> list[str]:
    return [str(a) for a in config.get("architectures") or []]


# ---------------------------------------------------------------------------------------------- EAGLE-3 layouts
def _eagle3_tensor_rules(
    config: dict[str, Any], layer_config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport
) -> tuple[set[str], str]:
    top_ids = _ids(config.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids")
    eagle_config = config.get("eagle_config") or {}
    sglang_ids = _ids(eagle_config.get("eagle_aux_hidden_state_layer_ids"), "eagle_config ids")
    num_aux = int(config.get("num_aux_hidden_states") or len(top_ids or sglang_ids or [0, 0, 0]))
    geometry = llama_geometry(layer_config, config.get("draft_vocab_size"), num_aux)
    prefixes = {p for p in ("midlayer.", "layers.0.") if any(n.startswith(p) for n in tensors)}
    if len(prefixes) > 1:
        report.problems.append("both midlayer.* and layers.0.* tensors: engines map one onto the other")
    prefix = prefixes.pop() if len(prefixes) == 1 else "layers.0."
    if any(n.startswith("layers.") and not n.startswith("layers.0.") for n in tensors):
        report.problems.append("more than one draft layer: specheads exports one, and engines disagree on the rest")
    expected = eagle3_shapes(geometry, prefix)
    optional = {"embed_tokens.weight": (geometry.vocab_size, geometry.hidden_size)}
    report.problems += _tensor_problems(tensors, expected, optional)
    if geometry.reduced_vocab:
        report.problems += draft_map_problems(
            tensors.get("d2t"), tensors.get("t2d"), geometry.vocab_size, geometry.draft_vocab_size
        )
    for ids in (top_ids, sglang_ids):
        if ids is not None and len(set(ids)) != len(ids):
            report.problems.append(
                f"layer ids {ids} repeat a layer: engines capture it once and fc gets fewer features"
            )
    if config.get("bias") or layer_config.get("attention_bias"):
        report.problems.append(
            "bias / attention_bias is true: vLLM then gives q/k/v/o a bias the file lacks (torch.empty)"
        )
    if top_ids is not None and any(i < 0 for i in top_ids):
        report.problems.append(f"eagle_aux_hidden_state_layer_ids {top_ids} holds a negative hidden_states index")
    return set(expected) | set(optional), prefix


def _vllm_eagle3(config: dict[str, Any], tensors: dict[str, torch.Tensor], known: set[str]) -> list[str]:
    problems = []
    for name in _unknown(tensors, known | {"t2d", "d2t"}):
        if not name.endswith(".bias"):
            problems.append(f"unknown tensor {name}: vLLM raises ValueError (no parameter named {name})")
    draft_vocab = config.get("draft_vocab_size")
    layer_config = config.get("transformer_layer_config") or config
    if "d2t" in tensors and draft_vocab in (None, layer_config.get("vocab_size")):
        problems.append("d2t with a full draft vocabulary: vLLM has no draft_id_to_target_id then and raises")
    for name in sorted(n for n in tensors if n.endswith(".bias")):
        if _nonzero_bias(tensors, name):
            problems.append(f"{name} is non-zero: vLLM's EAGLE-3 drops .bias tensors silently")
    return problems


def _check_eagle3(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    known, _ = _eagle3_tensor_rules(config, config, tensors, report)
    architectures = _architectures(config)
    targeted = any(a in EAGLE3_ARCHITECTURES for a in architectures)
    top_ids = config.get("eagle_aux_hidden_state_layer_ids")
    sglang_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")

    vllm = EngineVerdict("vllm", targeted, note="" if targeted else f"architectures {architectures}")
    if targeted:
        vllm.problems += _vllm_eagle3(config, tensors, known)
        if top_ids is None and sglang_ids is not None:
            vllm.problems.append(
                "no top-level eagle_aux_hidden_state_layer_ids: vLLM reads eagle_config's ids as hidden_states "
                f"indices, one below what SGLang means by them; write eagle_aux_hidden_state_layer_ids = "
                f"{vllm_layer_ids(sglang_ids)}"
            )
        vllm.note = "method eagle3"
    sglang = EngineVerdict("sglang", "LlamaForCausalLMEagle3" in architectures)
    if not sglang.targeted:
        sglang.note = f"architectures {architectures} lacks LlamaForCausalLMEagle3"
    else:
        sglang.problems += [
            f"unknown tensor {name}: SGLang skips it without a word"
            for name in _unknown(tensors, known | {"t2d", "d2t"})
        ]
        if config.get("tie_word_embeddings"):
            sglang.problems.append("tie_word_embeddings is true: SGLang then uses the embedding as lm_head")
        if config.get("norm_before_residual"):
            sglang.problems.append("norm_before_residual is true: SGLang's EAGLE-3 layer cannot run that variant")
        if sglang_ids is None and top_ids is not None:
            sglang.problems.append(
                "no eagle_config.eagle_aux_hidden_state_layer_ids: SGLang ignores the top-level ids and captures its "
                "default layers"
            )
        if sglang_ids is not None and any(i < 0 for i in sglang_ids):
            sglang.problems.append(f"eagle_config ids {sglang_ids}: SGLang cannot capture the embeddings (id -1)")
        if sglang_ids is not None and top_ids is not None and list(top_ids) != vllm_layer_ids(sglang_ids):
            sglang.problems.append(
                f"layer-id conventions disagree: top-level (vLLM, hidden_states index) {top_ids} must be "
                f"eagle_config's (SGLang, output of layer id) {sglang_ids} + 1"
            )
        if _nonzero_bias(tensors, "fc.bias") and not config.get("bias"):
            sglang.problems.append("fc.bias is non-zero but config 'bias' is false: SGLang builds fc without it")
    report.verdicts += [
        vllm,
        sglang,
        EngineVerdict("speculators", False, note="reads only the speculators format"),
        _llamacpp_verdict(top_ids),
    ]


def _llamacpp_verdict(top_ids: Any) -> EngineVerdict:
    """llama.cpp's converter reads the top-level ids (its default [2, L//2, L-3] when absent) and its EAGLE-3 graph
    exactly three of them; heads with another count are simply not for llama.cpp."""
    from specheads.export.llamacpp import NUM_TARGET_LAYERS, layer_id_problems

    if isinstance(top_ids, list) and len(top_ids) != NUM_TARGET_LAYERS:
        note = f"its EAGLE-3 graph reads exactly 3 feature layers, not {top_ids}"
        return EngineVerdict("llama.cpp", False, note=note)
    note = "convert with convert_hf_to_gguf.py --target-model-dir BASE, or write it with specheads export --format gguf"
    return EngineVerdict("llama.cpp", True, layer_id_problems(top_ids, None), note=note)


def _check_speculators(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    if config.get("speculators_model_type") != "eagle3":
        report.problems.append(
            f"speculators_model_type {config.get('speculators_model_type')!r}: only 'eagle3' is a speculators format "
            "specheads writes and vLLM serves as EAGLE-3"
        )
        return
    layer_config = config.get("transformer_layer_config")
    if not isinstance(layer_config, dict):
        report.problems.append("transformer_layer_config must be a dict (vLLM and speculators rebuild it)")
        return
    if layer_config.get("model_type") not in ("llama", "qwen3"):
        report.problems.append(
            f"transformer_layer_config.model_type {layer_config.get('model_type')!r}: vLLM maps only llama / qwen3"
        )
    spec = config.get("speculators_config") or {}
    methods = spec.get("proposal_methods") or [{}]
    tokens = methods[0].get("speculative_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        report.problems.append("speculators_config.proposal_methods[0].speculative_tokens must be an integer >= 1")
    if spec.get("default_proposal_method") not in [m.get("proposal_type") for m in methods]:
        report.problems.append("speculators_config.default_proposal_method names no proposal method")
    verifier = spec.get("verifier")
    if not isinstance(verifier, dict) or "name_or_path" not in verifier:
        report.problems.append("speculators_config.verifier.name_or_path is required (vLLM validates it)")
    if "norm_before_residual" not in config:
        report.problems.append(
            "norm_before_residual is not written: vLLM then assumes true and speculators false, two different drafts"
        )
    if config.get("norm_before_fc") and config.get("fc_norm"):
        report.problems.append("norm_before_fc and fc_norm are mutually exclusive")
    merged = {**config, "draft_vocab_size": config.get("draft_vocab_size") or layer_config.get("vocab_size")}
    known, prefix = _eagle3_tensor_rules(merged, layer_config, tensors, report)
    if prefix != "layers.0.":
        report.problems.append("the speculators format names the draft layer layers.0.*")
    vllm = EngineVerdict("vllm", True, _vllm_eagle3(merged, tensors, known), note="speculators format")
    speculators = EngineVerdict("speculators", True)
    if "embed_tokens.weight" not in tensors:
        speculators.problems.append(
            "no embed_tokens.weight: speculators 0.9.0 does not fill it from the verifier and drafts from "
            "uninitialised memory"
        )
    reduced = merged["draft_vocab_size"] != layer_config.get("vocab_size")
    if reduced and "t2d" not in tensors:
        speculators.problems.append("no t2d with a reduced draft vocabulary: speculators fails to load the lm_head")
    speculators.problems += [
        f"unknown tensor {name}: speculators ignores it" for name in _unknown(tensors, known | {"t2d", "d2t"})
    ]
    report.verdicts += [
        vllm,
        EngineVerdict("sglang", False, note="SGLang reads no speculators format"),
        speculators,
        _llamacpp_verdict(config.get("eagle_aux_hidden_state_layer_ids")),
    ]


# ---------------------------------------------------------------------------------------------- EAGLE-1
def _check_eagle1(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    geometry = llama_geometry(config)
    expected = eagle1_shapes(geometry)
    optional = {"embed_tokens.weight": (geometry.vocab_size, geometry.hidden_size)}
    bias = expected.pop("fc.bias")
    report.problems += _tensor_problems(tensors, expected, {**optional, "fc.bias": bias})
    known = set(expected) | set(optional) | {"fc.bias"}
    if config.get("bias") or config.get("attention_bias"):
        report.problems.append(
            "bias / attention_bias is true: SGLang and vLLM then give q/k/v/o a bias the file lacks (vLLM: "
            "torch.empty); the fc bias needs no config field"
        )
    architectures = _architectures(config)
    sglang = EngineVerdict("sglang", SGLANG_EAGLE1 in architectures)
    if not sglang.targeted:
        sglang.note = f"architectures {architectures} lacks {SGLANG_EAGLE1}"
    else:
        if "fc.bias" not in tensors:
            sglang.problems.append("no fc.bias: SGLang's EAGLE-1 fc has a bias and would keep its initial value")
        sglang.problems += [
            f"unknown tensor {name}: SGLang skips it with only a log warning" for name in _unknown(tensors, known)
        ]
    vllm = EngineVerdict("vllm", any(a in VLLM_EAGLE1 for a in architectures))
    if not vllm.targeted:
        vllm.note = f"architectures {architectures} lacks EagleLlamaForCausalLM (vLLM not asked for)"
    else:
        vllm.note = "method eagle"
        for name in _unknown(tensors, known):
            if not name.endswith(".bias"):
                vllm.problems.append(f"unknown tensor {name}: vLLM raises ValueError (no parameter named {name})")
        if _nonzero_bias(tensors, "fc.bias"):
            vllm.problems.append(
                "fc.bias is non-zero: vLLM's EAGLE-1 fc has no bias and drops it silently (train with "
                "heads.fc_bias=false to serve on vLLM)"
            )
    report.verdicts += [vllm, sglang]


# ---------------------------------------------------------------------------------------------- Medusa
def _check_medusa(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    heads, layers = config.get("medusa_num_heads"), config.get("medusa_num_layers", 1)
    for name, value in (("medusa_num_heads", heads), ("medusa_num_layers", layers)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            report.problems.append(f"{name} must be an integer >= 1, got {value!r}")
            return
    if not isinstance(config.get("base_model_name_or_path"), str):
        report.problems.append("base_model_name_or_path is missing: TGI and FasterDecoding load the base from it")
    first = tensors.get("0.0.linear.weight")
    if first is None:
        report.problems.append("missing tensor 0.0.linear.weight")
        return
    hidden = int(first.shape[1])
    lm_heads = [tensors.get(f"{h}.{layers}.weight") for h in range(heads)]
    own = any(t is not None for t in lm_heads)
    vocab = next((int(t.shape[0]) for t in lm_heads if t is not None), int(config.get("vocab_size") or 0))
    for field_name, value in (("hidden_size", hidden), ("vocab_size", vocab)):
        if field_name in config and config[field_name] != value and (field_name != "vocab_size" or own):
            report.problems.append(f"config {field_name} {config[field_name]} but the tensors have {value}")
    expected = medusa_shapes(heads, layers, hidden, vocab, own)
    report.problems += _tensor_problems(tensors, expected, {})
    extra = _unknown(tensors, set(expected))
    report.problems += [f"unknown tensor {name}: Medusa loaders ignore it without a word" for name in extra]
    tgi = EngineVerdict("tgi", True)
    if "architectures" in config:
        tgi.problems.append("config has 'architectures': TGI then looks for an MLP speculator and loads no Medusa")
    if not own and layers != 1:
        tgi.problems.append("shared-lm_head heads need medusa_num_layers == 1 in TGI (MedusaHeadV2)")
    tgi.note = "MedusaHeadV1" if own else "MedusaHeadV2 (the base's lm_head)"
    trt = EngineVerdict("tensorrt-llm", own, note="" if own else "reads only heads with their own lm_head")
    faster = EngineVerdict("fasterdecoding", True, note="medusa_model.py" if own else "medusa_model_legacy.py")
    report.verdicts += [tgi, trt, faster]
