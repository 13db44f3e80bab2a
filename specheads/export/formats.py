"""Export specheads heads to the layouts serving engines read, and import heads published in those layouts.

Export writes into a temporary folder next to ``out``, replays the engines' loading rules on it
(:func:`~specheads.export.check.check_export`) and only then renames it to ``out``: a refused or failed export leaves
nothing behind, and an existing non-empty ``out`` is never touched.

Import (:func:`import_heads`) builds native :class:`~specheads.heads.EagleHead` / :class:`~specheads.heads.MedusaHeads`
from a foreign layout. A foreign checkpoint carries no fingerprint of its base, so every shape is checked against the
base it is loaded with (hidden size, vocabulary, feature layers, an embedding it carries) and a warning says that this
is all that was checked. Directories written by :func:`export_heads` do carry specheads' record of the base (in the
safetensors metadata, which engines ignore), and importing them checks the fingerprint as for native checkpoints.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, PreTrainedModel

from specheads.export.check import PICKLE_SUFFIXES, CheckReport, check_export, detect_format
from specheads.export.layouts import (
    CONFIG_NAME,
    EAGLE_WEIGHTS,
    MEDUSA_WEIGHTS,
    SPECULATORS_VERSION,
    rename,
    sglang_layer_ids,
    swap_prefix,
    vllm_layer_ids,
)
from specheads.heads.checkpoint import HeadCheckpointError, base_model_info, check_base
from specheads.heads.eagle import EagleConfig, EagleHead, default_layer_ids
from specheads.heads.medusa import MedusaConfig, MedusaHeads
from specheads.loading import vocab_size

FORMATS = ("eagle3", "speculators", "eagle", "medusa", "gguf")
METADATA_KEY = "specheads_base_model"  # safetensors metadata: specheads' record of the base (engines ignore it)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ExportResult:
    """What :func:`export_heads` wrote and where it serves."""

    directory: Path
    format: str
    report: CheckReport
    commands: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"wrote {self.format} heads to {self.directory}", self.report.render()]
        if self.commands:
            lines.append("serve with:")
            lines += [f"  {engine}: {command}" for engine, command in self.commands.items()]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


# ================================================================================================ export
def export_heads(
    heads: torch.nn.Module,
    out: str | Path,
    format: str,
    base_model: PreTrainedModel | None = None,
    base_name: str | None = None,
    engines: list[str] | None = None,
    num_speculative_tokens: int | None = None,
    dtype: str | torch.dtype | None = None,
    target_gguf: str | Path | None = None,
) -> ExportResult:
    """Write ``heads`` to ``out`` in ``format`` and check the result against the engines that serve it.

    Args:
        heads: an :class:`EagleHead` or :class:`MedusaHeads` (checked against ``base_model`` when both are given).
        out: a new (or empty) directory.
        format: ``eagle3`` | ``speculators`` | ``eagle`` | ``medusa`` | ``gguf`` (an EAGLE-3 draft file for
            llama.cpp; ``out`` is then a new ``.gguf`` file).
        base_model: the base the heads belong to. ``speculators`` needs it (it writes the base's ``embed_tokens``,
            which speculators never fills in itself); Medusa heads with a shared lm_head write per-head copies of it.
        base_name: the base's hub id or path written into the config and the serve commands (default: the base's
            ``name_or_path``).
        engines: the engines the export must serve (default: every engine the heads can serve in this format).
            Naming one that cannot serve the heads (vLLM with a non-zero EAGLE-1 fc bias) is an error.
        num_speculative_tokens: draft length written for vLLM (default: the calibrated depth, else 3).
        dtype: ``float32`` | ``bfloat16`` | ``float16`` (default: the heads' own; ``gguf``: float32, with norms
            always float32 as llama.cpp's converter keeps them).
        target_gguf: ``gguf`` only: the base's GGUF file llama.cpp serves, whose tokenizer the draft copies and whose
            vocabulary and depth it is checked against (default: the vocabulary is built from the base's tokenizer).

    Raises:
        ValueError: unknown format, heads of the wrong type for it, a base the format needs is missing, ``out``
            exists and is not empty, or an engine was asked for that cannot serve the heads.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {list(FORMATS)}")
    if format == "gguf":
        return _export_gguf(heads, out, base_model, base_name, num_speculative_tokens, dtype, target_gguf)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory; refusing to overwrite it (nothing was written)")
    if base_model is not None:
        heads.attach_base(base_model)
    name = base_name or (getattr(base_model.config, "_name_or_path", "") if base_model is not None else "")
    name = name or heads.config.base_model.get("name_or_path", "") or ""
    if name and Path(name).expanduser().exists():  # a local folder: absolute, or engines read it as a hub id
        name = str(Path(name).expanduser().resolve())
    writer = {"eagle3": _eagle3, "speculators": _speculators, "eagle": _eagle1, "medusa": _medusa}[format]
    config, tensors, serve, notes = writer(heads, base_model, name, engines, num_speculative_tokens)
    cast = DTYPES[dtype] if isinstance(dtype, str) else dtype
    if isinstance(dtype, str) and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {list(DTYPES)}")
    tensors = {
        key: (t.to(cast) if cast is not None and t.is_floating_point() else t).detach().cpu().contiguous()
        for key, t in tensors.items()
    }
    float_dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), torch.float32)
    if "medusa_num_heads" not in config:
        config["torch_dtype"] = str(float_dtype).removeprefix("torch.")
    metadata = {"format": "pt", METADATA_KEY: json.dumps(heads.config.base_model)}
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        save_file(tensors, str(staging / (MEDUSA_WEIGHTS if format == "medusa" else EAGLE_WEIGHTS)), metadata=metadata)
        (staging / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        report = check_export(staging, format)
        if not report.ok:
            raise RuntimeError(
                f"specheads wrote a {format} directory that fails its own checks: {report.all_problems()}"
            )
        staging.chmod(0o755)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    report.directory = str(out)
    # Absolute: engines read a relative directory name as a hub id.
    commands = {engine: command.replace("{out}", str(out.resolve())) for engine, command in serve.items()}
    return ExportResult(out, format, report, commands, notes)


def _export_gguf(heads, out, base, base_name, steps, dtype, target_gguf):  # noqa: ANN001, ANN202
    from specheads.export import llamacpp

    _check_heads(heads, "gguf", EagleHead, 3)
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
    steps = _speculative_tokens(heads, steps)
    config, tensors, _, notes = _eagle3(heads, base, base_name or "", None, steps)
    report = llamacpp.write_gguf_draft(config, tensors, out, target, dtype)
    base_gguf = str(Path(target_gguf).resolve()) if target_gguf is not None else "<base.gguf>"
    commands = {"llama.cpp": llamacpp.llama_server_command(base_gguf, str(out.resolve()), steps)}
    notes = [n for n in notes if not n.startswith(("sglang", "vllm"))]
    notes.append(f"tokenizer from {target.source}; llama.cpp drafts and verifies chains (draft length {steps})")
    return ExportResult(out, "gguf", report, commands, notes)


def _check_heads(heads: torch.nn.Module, format: str, kind: type, version: int | None = None) -> None:
    if not isinstance(heads, kind) or (version is not None and heads.config.version != version):
        have = f"EAGLE-{heads.config.version}" if isinstance(heads, EagleHead) else type(heads).__name__
        want = {"eagle": "EAGLE-1", "medusa": "Medusa"}.get(format, "EAGLE-3")
        raise ValueError(f"the {format} format holds {want} heads; these are {have} heads")


def _engines(wanted: list[str] | None, possible: dict[str, str], format: str) -> list[str]:
    """The engines to serve: ``possible`` maps engine -> '' (can serve) or the reason it cannot."""
    if wanted is None:
        return [engine for engine, reason in possible.items() if not reason]
    for engine in wanted:
        if engine not in possible:
            raise ValueError(f"the {format} format is not served by {engine!r}; engines: {sorted(possible)}")
        if possible[engine]:
            raise ValueError(f"{engine} cannot serve these heads: {possible[engine]}")
    return list(wanted)


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


def _speculative_tokens(heads: torch.nn.Module, requested: int | None) -> int:
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {requested!r}")
        return requested
    dynamic = getattr(heads, "calibrated_dynamic", None) or {}
    return int(dynamic.get("depth", 3))


def _sglang_tree(heads: EagleHead, steps: int) -> str:
    dynamic = heads.calibrated_dynamic or {"top_k": 4, "depth": steps, "total_tokens": 8}
    return (
        f"--speculative-num-steps {dynamic['depth']} --speculative-eagle-topk {dynamic['top_k']} "
        f"--speculative-num-draft-tokens {dynamic['total_tokens']}"
    )


def _vllm_command(base: str, method: str, steps: int) -> str:
    spec = json.dumps({"method": method, "model": "{out}", "num_speculative_tokens": steps})
    return f"vllm serve {base or '<base>'} --speculative-config '{spec}'"


def _llamacpp_command(base: str, steps: int) -> str:
    """Convert with llama.cpp's own converter (or write the file directly: specheads export --format gguf), serve."""
    return (
        f"python convert_hf_to_gguf.py {{out}} --target-model-dir {base or '<base>'} --outfile draft.gguf "
        f"(or specheads export --format gguf --out draft.gguf), then "
        f"llama-server -m <base.gguf> -md draft.gguf --spec-type draft-eagle3 --spec-draft-n-max {steps}"
    )


def _engine_layer_order(head: EagleHead, format: str) -> tuple[list[int], dict[str, torch.Tensor]]:
    """The feature layers in the order engines concatenate them (ascending, each once), with fc's columns to match.

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
    return [ids[i] for i in order], state


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


def _eagle3(head, base, name, engines, steps):  # noqa: ANN001, ANN202 (one of four writers with one signature)
    _check_heads(head, "eagle3", EagleHead, 3)
    steps = _speculative_tokens(head, steps)
    ids, tensors = _eagle3_tensors(head, "eagle3")
    possible = {"vllm": "", "sglang": ""}
    if min(ids) < 1:
        possible["sglang"] = f"layer_ids {ids} read the embeddings (hidden_states[0]), which SGLang cannot capture"
    elif head.config.norm_before_residual:
        possible["sglang"] = "norm_before_residual heads: SGLang's EAGLE-3 layer has no such variant"
    serve = _engines(engines, possible, "eagle3")
    config = _draft_layer_config(head, ["LlamaForCausalLMEagle3"] if "sglang" in serve else ["Eagle3LlamaForCausalLM"])
    config.update(
        draft_vocab_size=head.config.draft_vocab_size,
        target_hidden_size=head.config.hidden_size,
        eagle_aux_hidden_state_layer_ids=ids,
        norm_before_residual=head.config.norm_before_residual,
        bias=False,
        eagle_config={"use_aux_hidden_state": True},
    )
    if "sglang" in serve:
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = sglang_layer_ids(ids)
    commands = {"vllm": _vllm_command(name, "eagle3", steps)}
    if len(ids) == 3:
        commands["llama.cpp"] = _llamacpp_command(name, steps)
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


def _speculators(head, base, name, engines, steps):  # noqa: ANN001, ANN202
    _check_heads(head, "speculators", EagleHead, 3)
    if base is None:
        raise ValueError(
            "the speculators format needs the base (--base): it writes the base's embed_tokens, which speculators "
            "does not fill in itself, and names the verifier"
        )
    _engines(engines, {"vllm": "", "speculators": ""}, "speculators")
    steps = _speculative_tokens(head, steps)
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
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
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
    commands = {"vllm": _vllm_command(name, "eagle3", steps)}
    if len(ids) == 3:
        commands["llama.cpp"] = _llamacpp_command(name, steps)
    notes = ["load in Python with speculators: SpeculatorModel.from_pretrained(out) (the verifier path must load)"]
    return config, tensors, commands, notes


def _eagle1(head, base, name, engines, steps):  # noqa: ANN001, ANN202
    _check_heads(head, "eagle", EagleHead, 1)
    steps = _speculative_tokens(head, steps)
    bias = head.fc.bias
    nonzero = bias is not None and bool(bias.abs().max() > 0)
    possible = {
        "sglang": "",
        "vllm": "the head's fc has a non-zero bias and vLLM's EAGLE-1 fc has none (it drops fc.bias silently); "
        "train with heads.fc_bias=false to serve on vLLM"
        if nonzero
        else "",
    }
    serve = _engines(engines, possible, "eagle")
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
        commands["vllm"] = _vllm_command(name, "eagle", steps)
    notes = [f"{e} not served: {possible[e]}" for e in possible if possible[e]]
    return config, tensors, commands, notes


def _medusa(heads, base, name, engines, steps):  # noqa: ANN001, ANN202
    _check_heads(heads, "medusa", MedusaHeads)
    config_h = heads.config
    layers = config_h.num_layers
    tensors = {}
    for head, blocks in enumerate(heads.blocks):
        for layer, block in enumerate(blocks):
            tensors[f"{head}.{layer}.linear.weight"] = block.linear.weight
            tensors[f"{head}.{layer}.linear.bias"] = block.linear.bias
    notes = []
    if heads.lm_heads is not None:
        for head, lm_head in enumerate(heads.lm_heads):
            tensors[f"{head}.{layers}.weight"] = lm_head.weight
    elif base is not None:  # every reader then loads it as Medusa-1, each head with a copy of the base's lm_head
        for head in range(config_h.num_heads):
            tensors[f"{head}.{layers}.weight"] = base.get_output_embeddings().weight.detach().clone()
        notes.append("shared lm_head written as per-head copies of the base's (Medusa-1 layout, every reader)")
    else:
        notes.append("shared lm_head layout (no --base): TGI's MedusaHeadV2 and FasterDecoding's legacy model only")
    own = f"0.{layers}.weight" in tensors
    possible = {
        "tgi": "" if own or layers == 1 else "TGI reads shared-lm_head heads only with one layer per head",
        "tensorrt-llm": "" if own else "TensorRT-LLM reads only heads with their own lm_head (pass --base)",
        "fasterdecoding": "",
    }
    serve = _engines(engines, possible, "medusa")
    config = {
        "medusa_num_heads": config_h.num_heads,
        "medusa_num_layers": layers,
        "base_model_name_or_path": name,
        "hidden_size": config_h.hidden_size,
        "vocab_size": config_h.vocab_size,
    }
    commands = {}
    if "tgi" in serve:
        commands["tgi"] = f"text-generation-launcher --model-id {{out}}  (base from base_model_name_or_path: {name})"
    if "tensorrt-llm" in serve:
        commands["tensorrt-llm"] = (
            f"python examples/medusa/convert_checkpoint.py --model_dir {name or '<base>'} --medusa_model_dir {{out}} "
            f"--num_medusa_heads {config_h.num_heads} --output_dir <trt-ckpt>"
        )
    commands["fasterdecoding"] = "python -m medusa.inference.cli --model {out}"
    notes += [f"{e} not served: {possible[e]}" for e in possible if possible[e]]
    return config, tensors, commands, notes


# ================================================================================================ import
def foreign_format(directory: str | Path) -> str | None:
    """The layout of a head directory: ``"native"``, one of :data:`FORMATS`, or None when it is none of them."""
    config_path = Path(directory) / CONFIG_NAME
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    names = None
    weights = Path(directory) / EAGLE_WEIGHTS
    if weights.is_file():
        try:
            with safe_open(str(weights), "pt") as handle:
                names = set(handle.keys())
        except Exception:  # a corrupt file: the loader names it
            names = None
    return detect_format(config, names)


def import_heads(directory: str | Path, base_model: PreTrainedModel | None, format: str) -> torch.nn.Module:
    """Native heads from a foreign layout (see the module docstring for what is checked)."""
    directory = Path(directory)
    where = str(directory)
    if base_model is None:
        raise HeadCheckpointError(
            f"{where} is a {format} checkpoint, which records no fingerprint of its base: load it with its base "
            "(load_heads(dir, base_model)) so that every shape can be checked against it"
        )
    config = json.loads((directory / CONFIG_NAME).read_text())
    weights_name = MEDUSA_WEIGHTS if format == "medusa" else EAGLE_WEIGHTS
    tensors, metadata = _read_tensors(directory, weights_name)
    recorded = json.loads(metadata[METADATA_KEY]) if METADATA_KEY in metadata else None
    try:
        if format == "medusa":
            heads = _import_medusa(config, tensors, base_model, where)
        else:
            heads = _import_eagle(config, tensors, base_model, where, format)
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, HeadCheckpointError):
            raise
        raise HeadCheckpointError(f"{where}: not a loadable {format} checkpoint: {error}") from error
    if recorded:
        check_base(recorded, base_model, f"the heads exported to {where}")
    else:
        warnings.warn(
            f"{where} is a {format} checkpoint without a fingerprint of its base: only its shapes were checked "
            f"against this base (hidden size, vocabulary, feature layers, embedding); make sure it was trained for it",
            stacklevel=3,
        )
    heads.config.base_model = recorded or base_model_info(base_model)
    return heads


def _read_tensors(directory: Path, weights_name: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    path = directory / weights_name
    if not path.is_file():
        pickles = sorted(p for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise HeadCheckpointError(
                f"{pickles[0]} is a pickle-based file; specheads never unpickles checkpoints (arbitrary code "
                f"execution). Convert it once in a trusted environment: safetensors.torch.save_file(torch.load(path), "
                f"'{directory / weights_name}')"
            )
        if (directory / f"{weights_name}.index.json").is_file():
            raise HeadCheckpointError(f"{directory}: sharded head checkpoints are not supported; merge the shards")
        raise HeadCheckpointError(f"{directory} holds no {weights_name}")
    try:
        with safe_open(str(path), "pt") as handle:
            metadata = handle.metadata() or {}
        return load_file(str(path)), metadata
    except Exception as error:  # safetensors raises its own error types for truncated or corrupt files
        raise HeadCheckpointError(f"{path} is not a readable safetensors file: {error}") from error


def _shape_error(where: str, what: str, theirs: Any, base: Any) -> HeadCheckpointError:
    return HeadCheckpointError(f"{where} was made for another base: {what} is {theirs} there but {base} for this base")


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
        for flag in ("norm_before_fc", "fc_norm", "norm_output"):
            if config.get(flag):
                raise HeadCheckpointError(f"{where}: {flag}=true drafts are not supported by specheads")
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
        for flag in ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output"):
            if config.get(flag) or eagle_config.get(flag):
                raise HeadCheckpointError(f"{where}: {flag}=true drafts are not supported by specheads")
    if int(layer.get("num_hidden_layers", 1)) != 1 or any(n.startswith("layers.1.") for n in tensors):
        raise HeadCheckpointError(f"{where}: drafts with more than one layer are not supported by specheads")
    llama = LlamaConfig.from_dict({k: v for k, v in layer.items() if k not in ("architectures", "auto_map")})
    num_layers = int(base.config.num_hidden_layers)
    hidden = int(base.get_output_embeddings().weight.shape[1])
    vocab = vocab_size(base)
    if llama.hidden_size != hidden:
        raise _shape_error(where, "the hidden size", llama.hidden_size, hidden)
    if llama.vocab_size != vocab:
        raise _shape_error(where, "the vocabulary size", llama.vocab_size, vocab)
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
            raise _shape_error(where, "t2d's length", t2d.numel(), vocab)
        targets = t2d.bool().nonzero().flatten()
        d2t = targets - torch.arange(targets.numel())
    d2t = d2t.long()
    targets = torch.arange(d2t.numel()) + d2t
    if d2t.numel() != draft_vocab or int(targets.min()) < 0 or int(targets.max()) >= vocab:
        raise HeadCheckpointError(f"{where}: d2t does not map {draft_vocab} draft ids into a vocabulary of {vocab}")
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[targets] = True
    return {"d2t": d2t, "t2d": t2d}


def _import_medusa(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], base: PreTrainedModel, where: str
) -> MedusaHeads:
    heads, layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    hidden = int(base.get_output_embeddings().weight.shape[1])
    vocab = vocab_size(base)
    first = tensors.get("0.0.linear.weight")
    if first is None:
        raise HeadCheckpointError(f"{where}: no 0.0.linear.weight; not a Medusa head file")
    if tuple(first.shape) != (hidden, hidden):
        raise _shape_error(where, "the hidden size", int(first.shape[1]), hidden)
    own = f"0.{layers}.weight" in tensors
    native = {}
    for head in range(heads):
        for layer in range(layers):
            for kind in ("weight", "bias"):
                native[f"blocks.{head}.{layer}.linear.{kind}"] = tensors.pop(f"{head}.{layer}.linear.{kind}")
        if own:
            lm_head = tensors.pop(f"{head}.{layers}.weight")
            if tuple(lm_head.shape) != (vocab, hidden):
                raise _shape_error(where, f"head {head}'s lm_head shape", list(lm_head.shape), [vocab, hidden])
            native[f"lm_heads.{head}.weight"] = lm_head
    if tensors:
        raise HeadCheckpointError(f"{where}: tensors that fit no Medusa head: {sorted(tensors)[:4]}")
    medusa = MedusaConfig(
        num_heads=heads, num_layers=layers, hidden_size=hidden, vocab_size=vocab, share_lm_head=not own
    )
    return MedusaHeads.from_checkpoint(asdict(medusa), native, where)
