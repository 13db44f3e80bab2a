"""EAGLE heads in the engines' layouts: ``eagle3`` (SGLang / vLLM ``LlamaForCausalLMEagle3``), ``speculators``
(vLLM's speculators format), ``eagle`` (EAGLE-1 as the EAGLE repository and SGLang read it) and ``gguf`` (llama.cpp's
``eagle3`` draft). Each is written, read back, checked against its engines' loading rules and recognised here;
:mod:`specheads.export.formats` runs them through the method's registry entry.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, PreTrainedModel

from specheads.methods.api import (
    SPECULATORS_VERSION,
    CheckReport,
    EngineVerdict,
    ExportFormat,
    ExportResult,
    FolderContents,
    FolderReader,
    HeadCheckpointError,
    check_heads,
    config_architectures,
    id_list,
    llamacpp_command,
    nonzero_bias,
    serving_engines,
    shape_error,
    speculative_tokens,
    tensor_problems,
    unknown_tensors,
    vllm_command,
    vocab_size,
)
from specheads.methods.eagle.heads import EagleConfig, EagleHead, default_layer_ids
from specheads.methods.eagle.layouts import (
    EAGLE_WEIGHTS,
    draft_map_problems,
    eagle1_shapes,
    eagle3_shapes,
    llama_geometry,
    rename,
    sglang_layer_ids,
    swap_prefix,
    vllm_layer_ids,
)
from specheads.methods.eagle.trees import TREES, DynamicTree

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SGLANG_EAGLE1 = "LlamaForCausalLMEagle"
VLLM_EAGLE1 = ("EagleLlamaForCausalLM", "LlamaForCausalLM")


# ================================================================================================ write
def _draft_layer_config(head: EagleHead, architectures: list[str] | None) -> dict[str, Any]:
    """The Llama config of the draft layer, with ``rope_theta`` mirrored for readers of the older field."""
    config = head.config.llama_config().to_dict()
    for key in ("_name_or_path", "transformers_version", "id2label", "label2id", "dtype", "output_attentions"):
        config.pop(key, None)
    config["architectures"] = architectures
    config["tie_word_embeddings"] = False
    rope = dict(head.config.rope_parameters)
    config["rope_theta"] = rope.get("rope_theta")
    if rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = rope
    return config


def _steps(head: EagleHead, requested: int | None) -> int:
    """The draft length written for the engines: ``requested``, else the calibrated EAGLE-2 tree's depth, else 3."""
    calibrated = TREES.calibrated(head.calibration)
    return speculative_tokens(requested, 3 if calibrated is None else calibrated.depth)


def _sglang_tree(heads: EagleHead, steps: int) -> str:
    tree = TREES.calibrated(heads.calibration) or DynamicTree(top_k=4, depth=steps, total_tokens=8)
    return (
        f"--speculative-num-steps {tree.depth} --speculative-eagle-topk {tree.top_k} "
        f"--speculative-num-draft-tokens {tree.total_tokens}"
    )


def _engine_layer_order(head: EagleHead, format: str) -> tuple[list[int], dict[str, torch.Tensor]]:
    """The feature layers in the order engines concatenate them (ascending, each once), with fc's columns (and the
    per-layer ``fc_norm.{k}``, or ``input_norm``'s blocks) to match.

    vLLM and SGLang capture each listed layer once and concatenate in layer order whatever order the config gives.
    """
    ids = list(head.config.layer_ids)
    if len(set(ids)) != len(ids):
        raise ValueError(
            f"layer_ids {ids} repeat a layer; vLLM and SGLang capture each layer once, so fc would get fewer features "
            f"than it reads: the {format} format needs distinct layer_ids (train with heads.layer_ids=[a, b, c])"
        )
    order = sorted(range(len(ids)), key=lambda i: ids[i])
    state = head.state_dict()
    hidden = head.config.hidden_size
    blocks = state["fc.weight"].split(hidden, dim=1)
    state["fc.weight"] = torch.cat([blocks[i] for i in order], dim=1)
    if head.config.fc_norm:
        norms = [state[f"fc_norm.{i}.weight"] for i in range(len(ids))]
        state.update({f"fc_norm.{k}.weight": norms[i] for k, i in enumerate(order)})
    if head.config.norm_before_fc:  # the rms over all blocks is the same in any order; its weight follows fc's columns
        scales = state["input_norm.weight"].split(hidden)
        state["input_norm.weight"] = torch.cat([scales[i] for i in order])
    return [ids[i] for i in order], state


def _eagle31_fields(head: EagleHead) -> dict[str, bool]:
    """EAGLE 3.1's config flags, written only when on (vLLM and SGLang read ``fc_norm`` and ``norm_output``);
    llama.cpp runs neither."""
    return {flag: True for flag in ("fc_norm", "norm_output") if getattr(head.config, flag)}


def _norm_fields(head: EagleHead) -> dict[str, bool]:
    """The fused-feature and output norm flags an export writes, each only when on: EAGLE 3.1's and
    ``norm_before_fc`` (which speculators and llama.cpp run, both checked in the tests; recent vLLM reads it too)."""
    return _eagle31_fields(head) | ({"norm_before_fc": True} if head.config.norm_before_fc else {})


def _llamacpp_ready(head: EagleHead, ids: list[int]) -> bool:
    """llama.cpp's EAGLE-3 graph: exactly three feature layers and none of EAGLE 3.1's norms (norm_before_fc runs)."""
    return len(ids) == 3 and not _eagle31_fields(head)


def _eagle3_tensors(head: EagleHead, format: str) -> tuple[list[int], dict[str, torch.Tensor]]:
    ids, state = _engine_layer_order(head, format)
    if "fc.bias" in state:
        if bool(state["fc.bias"].abs().max() > 0):
            raise ValueError(
                f"this EAGLE-3 head has a non-zero fc bias; the engines' EAGLE-3 fc has none (vLLM drops it "
                f"silently), so the {format} format cannot carry it: train with heads.fc_bias=false"
            )
        del state["fc.bias"]
    return ids, state


def _eagle3(
    head: Any, base: PreTrainedModel | None, name: str, engines: list[str] | None, steps: int | None
) -> FolderContents:
    check_heads(head, "eagle3", EagleHead, 3)
    steps = _steps(head, steps)
    ids, tensors = _eagle3_tensors(head, "eagle3")
    possible = {"vllm": "", "sglang": ""}
    if min(ids) < 1:
        possible["sglang"] = f"layer_ids {ids} read the embeddings (hidden_states[0]), which SGLang cannot capture"
    elif head.config.norm_before_residual:
        possible["sglang"] = "norm_before_residual heads: SGLang's EAGLE-3 layer has no such variant"
    serve = serving_engines(engines, possible, "eagle3")
    config = _draft_layer_config(head, ["LlamaForCausalLMEagle3"] if "sglang" in serve else ["Eagle3LlamaForCausalLM"])
    config.update(
        draft_vocab_size=head.config.draft_vocab_size,
        target_hidden_size=head.config.hidden_size,
        eagle_aux_hidden_state_layer_ids=ids,
        norm_before_residual=head.config.norm_before_residual,
        **_norm_fields(head),
        bias=False,
        eagle_config={"use_aux_hidden_state": True},
    )
    if head.config.norm_before_fc:  # vLLM reads it from eagle_config too (NVIDIA's checkpoints put it there)
        config["eagle_config"]["norm_before_fc"] = True
    if "sglang" in serve:
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = sglang_layer_ids(ids)
    commands = {"vllm": vllm_command(name, "eagle3", steps)}
    if _llamacpp_ready(head, ids):
        commands["llama.cpp"] = llamacpp_command(name, steps)
    if "sglang" in serve:
        commands["sglang"] = (
            f"python -m sglang.launch_server --model-path {name or '<base>'} --speculative-algorithm EAGLE3 "
            f"--speculative-draft-model-path {{out}} {_sglang_tree(head, steps)}"
        )
    notes = [f"{e} not served: {possible[e]}" for e in possible if possible[e]]
    notes.append(
        f"feature layers: hidden_states {ids} (vLLM ids, top-level eagle_aux_hidden_state_layer_ids)"
        + (f" = SGLang ids {sglang_layer_ids(ids)} (eagle_config)" if "sglang" in serve else "")
    )
    return config, tensors, commands, notes


def _speculators(
    head: Any, base: PreTrainedModel | None, name: str, engines: list[str] | None, steps: int | None
) -> FolderContents:
    check_heads(head, "speculators", EagleHead, 3)
    if base is None:
        raise ValueError(
            "the speculators format needs the base (--base): it writes the base's embed_tokens, which speculators "
            "does not fill in itself, and names the verifier"
        )
    serving_engines(engines, {"vllm": "", "speculators": ""}, "speculators")
    steps = _steps(head, steps)
    ids, state = _eagle3_tensors(head, "speculators")
    layer = _draft_layer_config(head, ["LlamaForCausalLM"])
    config = {
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "architectures": ["Eagle3DraftModel"],
        "transformer_layer_config": layer,
        "draft_vocab_size": head.config.draft_vocab_size,
        "norm_before_residual": head.config.norm_before_residual,
        "target_hidden_size": head.config.hidden_size,
        "eagle_aux_hidden_state_layer_ids": ids,
        "norm_before_fc": head.config.norm_before_fc,
        "fc_norm": head.config.fc_norm,
        "norm_output": head.config.norm_output,
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": steps,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": name or None,
                "architectures": list(base.config.architectures or [type(base).__name__]),
            },
        },
    }
    tensors = rename(state, swap_prefix("midlayer.", "layers.0."))
    tensors["embed_tokens.weight"] = base.get_input_embeddings().weight
    commands = {"vllm": vllm_command(name, "eagle3", steps)}
    if _llamacpp_ready(head, ids):
        commands["llama.cpp"] = llamacpp_command(name, steps)
    notes = ["load in Python with speculators: SpeculatorModel.from_pretrained(out) (the verifier path must load)"]
    return config, tensors, commands, notes


def _eagle1(
    head: Any, base: PreTrainedModel | None, name: str, engines: list[str] | None, steps: int | None
) -> FolderContents:
    check_heads(head, "eagle", EagleHead, 1)
    steps = _steps(head, steps)
    bias = head.fc.bias
    nonzero = bias is not None and bool(bias.abs().max() > 0)
    possible = {
        "sglang": "",
        "vllm": "the head's fc has a non-zero bias and vLLM's EAGLE-1 fc has none (it drops fc.bias silently); "
        "train with heads.fc_bias=false to serve on vLLM"
        if nonzero
        else "",
    }
    serve = serving_engines(engines, possible, "eagle")
    architectures = (["LlamaForCausalLMEagle"] if "sglang" in serve else []) + (
        ["EagleLlamaForCausalLM"] if "vllm" in serve else []
    )
    # No "bias" field: the official repo then defaults fc's bias on and SGLang always has it, while vLLM and SGLang
    # read "bias": true as an attention bias too (uninitialised in vLLM). fc.bias is written, as zeros if none.
    config = _draft_layer_config(head, architectures)
    tensors = rename(head.state_dict(), swap_prefix("midlayer.", "layers.0."))
    if "fc.bias" not in tensors:
        tensors["fc.bias"] = torch.zeros(head.config.hidden_size, dtype=head.fc.weight.dtype)
    commands = {}
    if "sglang" in serve:
        commands["sglang"] = (
            f"python -m sglang.launch_server --model-path {name or '<base>'} --speculative-algorithm EAGLE "
            f"--speculative-draft-model-path {{out}} {_sglang_tree(head, steps)}"
        )
    if "vllm" in serve:
        commands["vllm"] = vllm_command(name, "eagle", steps)
    notes = [f"{e} not served: {possible[e]}" for e in possible if possible[e]]
    return config, tensors, commands, notes


def _fold_for_gguf(heads: Any, base: PreTrainedModel, tokenizer: Any, texts: list[str]) -> tuple[Any, list[str]]:
    """EAGLE 3.1 heads folded into llama.cpp's graph from ``base``'s features on ``texts``
    (:mod:`specheads.methods.eagle.fold`); other heads as they are."""
    from specheads.methods.eagle import fold

    if not fold.needs_fold(heads):
        return heads, []
    folded, statistics = fold.fold_for_llamacpp(heads, base, fold.calibration_rows(tokenizer, texts))
    ratios = ", ".join(f"{ratio:.3f}" for ratio in statistics.block_ratios)
    return folded, [
        fold.FOLD_NOTE,
        f"fold statistics from {statistics.tokens} calibration tokens: block ratios {ratios}, kappa "
        f"{statistics.kappa:.3f}",
    ]


def _check_gguf_file(path: str | Path, target: str | Path | None) -> CheckReport:
    """The draft file's own checks and, given the target's GGUF, whether the pinned llama.cpp serves it with that
    target at all (the vocabulary, and an architecture whose graph hands EAGLE-3 its layer inputs)."""
    from specheads.methods.eagle import gguf

    target_vocab = gguf.read_target_gguf(target) if target else None
    report = gguf.check_gguf_draft(path, target_vocab)
    problem = gguf.target_architecture_problem(target_vocab) if target_vocab is not None else None
    for verdict in report.verdicts if problem else []:
        verdict.problems.append(problem)
    return report


def _export_gguf(
    heads: Any,
    out: str | Path,
    base: PreTrainedModel | None,
    base_name: str | None,
    steps: int | None,
    dtype: str | torch.dtype | None,
    target_gguf: str | Path | None,
) -> ExportResult:
    from specheads.methods.eagle import gguf as llamacpp

    check_heads(heads, "gguf", EagleHead, 3)
    if _eagle31_fields(heads):
        raise ValueError(llamacpp.EAGLE31_REFUSAL + " (nothing written)")
    out = Path(out)
    if out.suffix != ".gguf":
        raise ValueError(f"the gguf format writes one file: --out must end in .gguf, got {out}")
    if base is not None:
        heads.attach_base(base)
    dtype = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    if target_gguf is not None:
        target = llamacpp.read_target_gguf(target_gguf)
    else:
        folder = base_name or (getattr(base.config, "_name_or_path", "") if base is not None else "")
        if not folder or not Path(folder).is_dir():
            raise ValueError(
                "the gguf format needs the target's tokenizer: pass the base's GGUF file (--target-gguf) or a base "
                "folder with its tokenizer (--base)"
            )
        target = llamacpp.target_vocab_from_tokenizer(folder, heads.config.vocab_size)
    steps = _steps(heads, steps)
    config, tensors, _, notes = _eagle3(heads, base, base_name or "", None, steps)
    report = llamacpp.write_gguf_draft(config, tensors, out, target, dtype)
    base_gguf = str(Path(target_gguf).resolve()) if target_gguf is not None else "<base.gguf>"
    commands = {"llama.cpp": llamacpp.llama_server_command(base_gguf, str(out.resolve()), steps)}
    notes = [n for n in notes if not n.startswith(("sglang", "vllm"))]
    notes.append(f"tokenizer from {target.source}; llama.cpp drafts and verifies chains (draft length {steps})")
    if problem := llamacpp.target_architecture_problem(target):  # the file is right; this llama.cpp cannot use it
        notes.append(f"warning: {problem}")
    return ExportResult(out, "gguf", report, commands, notes)


# ================================================================================================ read
def _import_eagle(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], base: PreTrainedModel, where: str, format: str
) -> EagleHead:
    version = 1 if format == "eagle" else 3
    if format == "speculators":
        if config.get("speculators_model_type") != "eagle3":
            raise HeadCheckpointError(
                f"{where}: speculators model type {config.get('speculators_model_type')!r}; specheads imports eagle3"
            )
        layer = dict(config["transformer_layer_config"])
        if layer.get("model_type") != "llama":
            raise HeadCheckpointError(
                f"{where}: a {layer.get('model_type')} draft layer (q/k norms); specheads' EAGLE-3 layer is Llama-style"
            )
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        draft_vocab = config.get("draft_vocab_size") or layer["vocab_size"]
        norm_before_residual = bool(config.get("norm_before_residual", False))
    else:
        layer = config
        eagle_config = config.get("eagle_config") or {}
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        if ids is None and eagle_config.get("eagle_aux_hidden_state_layer_ids") is not None:
            ids = vllm_layer_ids(list(eagle_config["eagle_aux_hidden_state_layer_ids"]))  # SGLang's convention
        draft_vocab = config.get("draft_vocab_size") or layer["vocab_size"]
        norm_before_residual = bool(config.get("norm_before_residual", False))
        if config.get("use_aux_norm") or eagle_config.get("use_aux_norm"):
            raise HeadCheckpointError(f"{where}: use_aux_norm=true drafts are not supported by specheads")
    if int(layer.get("num_hidden_layers", 1)) != 1 or any(n.startswith("layers.1.") for n in tensors):
        raise HeadCheckpointError(f"{where}: drafts with more than one layer are not supported by specheads")
    llama = LlamaConfig.from_dict({k: v for k, v in layer.items() if k not in ("architectures", "auto_map")})
    num_layers = int(base.config.num_hidden_layers)
    hidden = int(base.get_output_embeddings().weight.shape[1])
    vocab = vocab_size(base)
    if llama.hidden_size != hidden:
        raise shape_error(where, "the hidden size", llama.hidden_size, hidden)
    if llama.vocab_size != vocab:
        raise shape_error(where, "the vocabulary size", llama.vocab_size, vocab)
    if version == 1:
        ids = [num_layers]
    elif ids is None:
        ids = default_layer_ids(num_layers)
    else:  # engines concatenate the features in layer order, whatever order the config lists them in
        ids = sorted(ids)
    tensors = rename(tensors, swap_prefix("layers.0.", "midlayer."))
    embedding = tensors.pop("embed_tokens.weight", None)
    if embedding is not None:
        own = base.get_input_embeddings().weight.detach().float().cpu()
        if tuple(embedding.shape) != tuple(own.shape) or not torch.allclose(
            embedding.float(), own, atol=1e-2, rtol=1e-2
        ):
            raise HeadCheckpointError(
                f"{where} carries an embed_tokens that differs from this base's; specheads heads read the base's "
                "embedding, so these heads belong to another base (or were trained with their own embedding)"
            )
    fc_bias = "fc.bias" in tensors
    reduced = int(draft_vocab) != vocab
    if reduced:
        tensors.update(_draft_map(tensors, vocab, int(draft_vocab), where))
    else:
        tensors.pop("d2t", None), tensors.pop("t2d", None)
    try:
        eagle_config = EagleConfig(
            version=version,
            hidden_size=hidden,
            vocab_size=vocab,
            draft_vocab_size=int(draft_vocab),
            num_attention_heads=llama.num_attention_heads,
            num_key_value_heads=llama.num_key_value_heads or llama.num_attention_heads,
            head_dim=getattr(llama, "head_dim", None) or hidden // llama.num_attention_heads,
            intermediate_size=llama.intermediate_size,
            rms_norm_eps=float(llama.rms_norm_eps),
            rope_parameters=dict(llama.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0}),
            max_position_embeddings=int(llama.max_position_embeddings),
            layer_ids=list(ids),
            fc_bias=fc_bias,
            norm_before_residual=norm_before_residual,
            fc_norm=bool(config.get("fc_norm", False)),
            norm_output=bool(config.get("norm_output", False)),
            norm_before_fc=bool(
                config.get("norm_before_fc") or (config.get("eagle_config") or {}).get("norm_before_fc")
            ),
            base_model={"num_hidden_layers": num_layers},
        )
    except ValueError as error:
        raise HeadCheckpointError(f"{where}: {error} (for this base, {num_layers} layers)") from error
    return EagleHead.from_checkpoint(asdict(eagle_config), tensors, where)


def _draft_map(tensors: dict[str, torch.Tensor], vocab: int, draft_vocab: int, where: str) -> dict[str, torch.Tensor]:
    """``d2t`` and ``t2d`` from whichever of the two the checkpoint has (ModelOpt writes no t2d)."""
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is None and t2d is None:
        raise HeadCheckpointError(f"{where}: a reduced draft vocabulary ({draft_vocab} of {vocab}) without d2t or t2d")
    if d2t is None:
        if t2d.numel() != vocab:
            raise shape_error(where, "t2d's length", t2d.numel(), vocab)
        targets = t2d.bool().nonzero().flatten()
        d2t = targets - torch.arange(targets.numel())
    d2t = d2t.long()
    targets = torch.arange(d2t.numel()) + d2t
    if d2t.numel() != draft_vocab or int(targets.min()) < 0 or int(targets.max()) >= vocab:
        raise HeadCheckpointError(f"{where}: d2t does not map {draft_vocab} draft ids into a vocabulary of {vocab}")
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[targets] = True
    return {"d2t": d2t, "t2d": t2d}


# ================================================================================================ check
def _eagle3_tensor_rules(
    config: dict[str, Any], layer_config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport
) -> tuple[set[str], str]:
    top_ids = id_list(config.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids")
    eagle_config = config.get("eagle_config") or {}
    sglang_ids = id_list(eagle_config.get("eagle_aux_hidden_state_layer_ids"), "eagle_config ids")
    num_aux = int(config.get("num_aux_hidden_states") or len(top_ids or sglang_ids or [0, 0, 0]))
    geometry = llama_geometry(layer_config, config.get("draft_vocab_size"), num_aux)
    prefixes = {p for p in ("midlayer.", "layers.0.") if any(n.startswith(p) for n in tensors)}
    if len(prefixes) > 1:
        report.problems.append("both midlayer.* and layers.0.* tensors: engines map one onto the other")
    prefix = prefixes.pop() if len(prefixes) == 1 else "layers.0."
    if any(n.startswith("layers.") and not n.startswith("layers.0.") for n in tensors):
        report.problems.append("more than one draft layer: specheads exports one, and engines disagree on the rest")
    norm_before_fc = bool(config.get("norm_before_fc") or eagle_config.get("norm_before_fc"))
    expected = eagle3_shapes(geometry, prefix, fc_norm=bool(config.get("fc_norm")), norm_before_fc=norm_before_fc)
    optional: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (geometry.vocab_size, geometry.hidden_size)}
    if "t2d" in expected:  # vLLM's and SGLang's EAGLE-3 loaders skip t2d (ModelOpt never writes it); speculators
        optional["t2d"] = expected.pop("t2d")  # needs it, which its own verdict checks
    report.problems += tensor_problems(tensors, expected, optional)
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
    for name in unknown_tensors(tensors, known | {"t2d", "d2t"}):
        if not name.endswith(".bias"):
            problems.append(f"unknown tensor {name}: vLLM raises ValueError (no parameter named {name})")
    draft_vocab = config.get("draft_vocab_size")
    layer_config = config.get("transformer_layer_config") or config
    if "d2t" in tensors and draft_vocab in (None, layer_config.get("vocab_size")):
        problems.append("d2t with a full draft vocabulary: vLLM has no draft_id_to_target_id then and raises")
    for name in sorted(n for n in tensors if n.endswith(".bias")):
        if nonzero_bias(tensors, name):
            problems.append(f"{name} is non-zero: vLLM's EAGLE-3 drops .bias tensors silently")
    return problems


def _check_eagle3(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    known, _ = _eagle3_tensor_rules(config, config, tensors, report)
    architectures = config_architectures(config)
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
            for name in unknown_tensors(tensors, known | {"t2d", "d2t"})
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
        if nonzero_bias(tensors, "fc.bias") and not config.get("bias"):
            sglang.problems.append("fc.bias is non-zero but config 'bias' is false: SGLang builds fc without it")
    report.verdicts += [
        vllm,
        sglang,
        EngineVerdict("speculators", False, note="reads only the speculators format"),
        _llamacpp_verdict(top_ids, config),
    ]


def _llamacpp_verdict(top_ids: Any, config: dict[str, Any]) -> EngineVerdict:
    """llama.cpp's converter reads the top-level ids (its default [2, L//2, L-3] when absent) and its EAGLE-3 graph
    exactly three of them and no EAGLE 3.1 norm; other heads are simply not for llama.cpp."""
    from specheads.methods.eagle.gguf import EAGLE31_REFUSAL, NUM_TARGET_LAYERS, eagle31_flags, layer_id_problems

    if eagle31_flags(config):
        return EngineVerdict("llama.cpp", False, note=EAGLE31_REFUSAL)
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
        f"unknown tensor {name}: speculators ignores it" for name in unknown_tensors(tensors, known | {"t2d", "d2t"})
    ]
    report.verdicts += [
        vllm,
        EngineVerdict("sglang", False, note="SGLang reads no speculators format"),
        speculators,
        _llamacpp_verdict(config.get("eagle_aux_hidden_state_layer_ids"), config),
    ]


def _check_eagle1(config: dict[str, Any], tensors: dict[str, torch.Tensor], report: CheckReport) -> None:
    geometry = llama_geometry(config)
    expected = eagle1_shapes(geometry)
    optional: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (geometry.vocab_size, geometry.hidden_size)}
    bias = expected.pop("fc.bias")
    report.problems += tensor_problems(tensors, expected, {**optional, "fc.bias": bias})
    known = set(expected) | set(optional) | {"fc.bias"}
    if config.get("bias") or config.get("attention_bias"):
        report.problems.append(
            "bias / attention_bias is true: SGLang and vLLM then give q/k/v/o a bias the file lacks (vLLM: "
            "torch.empty); the fc bias needs no config field"
        )
    architectures = config_architectures(config)
    sglang = EngineVerdict("sglang", SGLANG_EAGLE1 in architectures)
    if not sglang.targeted:
        sglang.note = f"architectures {architectures} lacks {SGLANG_EAGLE1}"
    else:
        if "fc.bias" not in tensors:
            sglang.problems.append("no fc.bias: SGLang's EAGLE-1 fc has a bias and would keep its initial value")
        sglang.problems += [
            f"unknown tensor {name}: SGLang skips it with only a log warning"
            for name in unknown_tensors(tensors, known)
        ]
    vllm = EngineVerdict("vllm", any(a in VLLM_EAGLE1 for a in architectures))
    if not vllm.targeted:
        vllm.note = f"architectures {architectures} lacks EagleLlamaForCausalLM (vLLM not asked for)"
    else:
        vllm.note = "method eagle"
        for name in unknown_tensors(tensors, known):
            if not name.endswith(".bias"):
                vllm.problems.append(f"unknown tensor {name}: vLLM raises ValueError (no parameter named {name})")
        if nonzero_bias(tensors, "fc.bias"):
            vllm.problems.append(
                "fc.bias is non-zero: vLLM's EAGLE-1 fc has no bias and drops it silently (train with "
                "heads.fc_bias=false to serve on vLLM)"
            )
    report.verdicts += [vllm, sglang]


# ================================================================================================ recognise
def _is_speculators(config: dict[str, Any], names: set[str] | None) -> bool:
    return "speculators_model_type" in config or "speculators_config" in config


def _eagle_layout(config: dict[str, Any], names: set[str] | None) -> int | None:
    """3 or 1 for an EAGLE-3 / EAGLE-1 engine layout (not speculators, not Medusa), else None."""
    if _is_speculators(config, names) or "medusa_num_heads" in config:
        return None
    architectures = config_architectures(config)
    if any("Eagle3" in a for a in architectures):
        return 3
    if any("Eagle" in a for a in architectures):
        return 1
    names = names or set()
    if "fc.weight" not in names:  # the official EAGLE-1 checkpoints name the plain LlamaForCausalLM architecture
        return None
    return 3 if any(n.endswith("hidden_norm.weight") for n in names) else 1


def _read(version: int, format: str) -> FolderReader:
    def read(config: dict[str, Any], tensors: dict[str, torch.Tensor], base: PreTrainedModel, where: str) -> EagleHead:
        return _import_eagle(config, tensors, base, where, format)

    return read


FORMATS = {
    "eagle3": ExportFormat(
        "eagle3",
        EAGLE_WEIGHTS,
        write=_eagle3,
        read=_read(3, "eagle3"),
        check=_check_eagle3,
        detect=lambda config, names: _eagle_layout(config, names) == 3,
    ),
    "speculators": ExportFormat(
        "speculators",
        EAGLE_WEIGHTS,
        write=_speculators,
        read=_read(3, "speculators"),
        check=_check_speculators,
        detect=_is_speculators,
        fallback=True,  # any speculators model type: its check names the unknown ones
    ),
    "eagle": ExportFormat(
        "eagle",
        EAGLE_WEIGHTS,
        write=_eagle1,
        read=_read(1, "eagle"),
        check=_check_eagle1,
        detect=lambda config, names: _eagle_layout(config, names) == 1,
    ),
    "gguf": ExportFormat(
        "gguf", "", export=_export_gguf, suffix=".gguf", check_file=_check_gguf_file, adapt=_fold_for_gguf
    ),
}
