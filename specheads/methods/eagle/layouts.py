"""The EAGLE checkpoint layouts serving engines read: tensor names and shapes, layer-id conventions, draft maps.

A layout is a ``config.json`` plus one safetensors file. Which engine reads what comes from the engines' own loading
code, read for vLLM 0.33, SGLang 0.5.23, speculators 0.9.0 and SpecForge; :mod:`specheads.methods.eagle.export`
writes, reads and checks them.

* ``eagle3``: the SpecForge / official EAGLE-3 layout (``LlamaForCausalLMEagle3``; ``midlayer.*``, ``fc``, ``norm``,
  ``lm_head``, ``d2t``/``t2d``; ``fc_norm.{k}`` and the ``fc_norm`` / ``norm_output`` flags for EAGLE 3.1 heads,
  ``input_norm`` with ``norm_before_fc``) that SGLang and vLLM (``method: eagle3``) load. The fused feature layers
  are written twice, once per convention: top-level ``eagle_aux_hidden_state_layer_ids`` in vLLM's (a
  ``hidden_states`` index, 0 = embeddings; the one specheads uses), which vLLM reads first, and
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` in SGLang's ("output of layer id", one less), the only one
  SGLang reads.
* ``speculators``: vLLM's speculators format (``speculators_model_type: eagle3``, ``transformer_layer_config``,
  ``speculators_config``; ``layers.0.*`` plus the base's ``embed_tokens``, which speculators does not fill in itself).
* ``eagle``: EAGLE-1 as the official repository and SGLang (``LlamaForCausalLMEagle``) and vLLM
  (``EagleLlamaForCausalLM``) read it: ``fc`` (with its bias, which SGLang requires and vLLM drops), ``layers.0.*``
  without an input norm, no final norm and no lm_head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

EAGLE_WEIGHTS = "model.safetensors"  # transformers' weights file name

# Draft-layer tensors, relative to the layer prefix (``midlayer.`` natively, ``layers.0.`` in most layouts).
ATTENTION = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight")
MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
EAGLE3_NORMS = ("input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight")
EAGLE1_NORMS = ("post_attention_layernorm.weight",)


@dataclass(frozen=True)
class Geometry:
    """The dimensions a layout's tensors must have, read from its config."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    num_aux: int = 3

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size


def layer_shapes(geometry: Geometry, prefix: str, version: int) -> dict[str, tuple[int, ...]]:
    """Shapes of one draft layer's tensors under ``prefix`` (EAGLE-3's q/k/v read 2h: embedding and feature)."""
    g = geometry
    width = 2 * g.hidden_size if version == 3 else g.hidden_size
    shapes: dict[str, tuple[int, ...]] = {
        "self_attn.q_proj.weight": (g.num_attention_heads * g.head_dim, width),
        "self_attn.k_proj.weight": (g.num_key_value_heads * g.head_dim, width),
        "self_attn.v_proj.weight": (g.num_key_value_heads * g.head_dim, width),
        "self_attn.o_proj.weight": (g.hidden_size, g.num_attention_heads * g.head_dim),
        "mlp.gate_proj.weight": (g.intermediate_size, g.hidden_size),
        "mlp.up_proj.weight": (g.intermediate_size, g.hidden_size),
        "mlp.down_proj.weight": (g.hidden_size, g.intermediate_size),
    }
    for norm in EAGLE3_NORMS if version == 3 else EAGLE1_NORMS:
        shapes[norm] = (g.hidden_size,)
    return {prefix + name: shape for name, shape in shapes.items()}


def eagle3_shapes(
    geometry: Geometry, prefix: str, fc_norm: bool = False, norm_before_fc: bool = False
) -> dict[str, tuple[int, ...]]:
    """Every tensor an EAGLE-3 draft needs (``d2t``/``t2d`` only with a reduced draft vocabulary; ``fc_norm.{k}``,
    one norm per fused layer, with EAGLE 3.1's ``fc_norm``; ``input_norm``, one norm over the concatenated
    features, with ``norm_before_fc``)."""
    g = geometry
    shapes = {
        "fc.weight": (g.hidden_size, g.num_aux * g.hidden_size),
        **({f"fc_norm.{k}.weight": (g.hidden_size,) for k in range(g.num_aux)} if fc_norm else {}),
        **({"input_norm.weight": (g.num_aux * g.hidden_size,)} if norm_before_fc else {}),
        **layer_shapes(g, prefix, 3),
        "norm.weight": (g.hidden_size,),
        "lm_head.weight": (g.draft_vocab_size, g.hidden_size),
    }
    if g.reduced_vocab:
        shapes["d2t"] = (g.draft_vocab_size,)
        shapes["t2d"] = (g.vocab_size,)
    return shapes


def eagle1_shapes(geometry: Geometry) -> dict[str, tuple[int, ...]]:
    """Every tensor an EAGLE-1 draft has: fc (and its bias), one layer without input norm; no norm, no lm_head."""
    g = geometry
    return {
        "fc.weight": (g.hidden_size, 2 * g.hidden_size),
        "fc.bias": (g.hidden_size,),
        **layer_shapes(g, "layers.0.", 1),
    }


def rename(tensors: dict[str, torch.Tensor], mapping: Callable[[str], str | None]) -> dict[str, torch.Tensor]:
    """``tensors`` with each name passed through ``mapping`` (None drops the tensor)."""
    renamed = {}
    for name, tensor in tensors.items():
        new = mapping(name)
        if new is not None:
            renamed[new] = tensor
    return renamed


def swap_prefix(old: str, new: str) -> Callable[[str], str]:
    """A name mapping for :func:`rename` that replaces the prefix ``old`` by ``new``."""
    return lambda name: new + name[len(old) :] if name.startswith(old) else name


def llama_geometry(config: dict[str, Any], draft_vocab_size: int | None = None, num_aux: int = 3) -> Geometry:
    """The geometry of a Llama-style draft config (head_dim and kv heads default as in transformers)."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    vocab = int(config["vocab_size"])
    return Geometry(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=vocab,
        draft_vocab_size=int(draft_vocab_size or config.get("draft_vocab_size") or vocab),
        num_aux=num_aux,
    )


def sglang_layer_ids(vllm_ids: list[int]) -> list[int]:
    """SGLang / SpecForge / ModelOpt ids ("output of layer id") of ``hidden_states`` indices (vLLM's convention)."""
    return [index - 1 for index in vllm_ids]


def vllm_layer_ids(sglang_ids: list[int]) -> list[int]:
    """``hidden_states`` indices (vLLM's convention) of SGLang / SpecForge ids; inverse of :func:`sglang_layer_ids`."""
    return [index + 1 for index in sglang_ids]


def draft_map_problems(d2t: torch.Tensor | None, t2d: torch.Tensor | None, vocab: int, draft_vocab: int) -> list[str]:
    """What is wrong with a draft-to-target map: d2t holds offsets (target id = draft id + d2t[draft id])."""
    problems = []
    if d2t is not None:
        if d2t.dtype != torch.int64:
            problems.append(f"d2t has dtype {d2t.dtype}, engines read int64 offsets")
        targets = torch.arange(d2t.numel()) + d2t.long()
        if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
            problems.append(
                f"d2t maps draft ids to target ids {int(targets.min())}..{int(targets.max())}, outside the "
                f"vocabulary of {vocab}"
            )
        elif targets.unique().numel() != targets.numel():
            problems.append("d2t maps two draft ids to the same target id")
        elif t2d is not None and t2d.numel() == vocab and not bool(t2d.bool()[targets].all()):
            problems.append("d2t and t2d disagree: a draft id maps to a target id that t2d does not mark")
    if t2d is not None:
        if t2d.dtype != torch.bool:
            problems.append(f"t2d has dtype {t2d.dtype}, engines read bool")
        if int(t2d.bool().sum()) != draft_vocab:
            problems.append(f"t2d marks {int(t2d.bool().sum())} target ids, the draft vocabulary has {draft_vocab}")
    return problems
