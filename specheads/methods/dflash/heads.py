"""Block-parallel draft heads on a frozen base: DFlash (Z Lab, arXiv 2602.06036) and DSpark (DeepSeek's DeepSpec).

A block drafter is a few Qwen3-style decoder layers that fill a whole block of mask tokens in **one** forward. The
block is ``[x_a, mask, ..., mask]`` (``block_size`` slots) at positions ``a, a + 1, ...``, where ``x_a`` is the
*anchor* (at decode time the root: the last committed token, whose base features do not exist yet). Its attention
reads, besides the block's own keys and values (bidirectional inside the block), the *context*: the fused base
features of every position before the anchor, injected as extra keys and values in every layer:

* ``ctx = hidden_norm(fc(cat(hidden_states[i] for i in layer_ids)))``: ``fc`` is Linear(K * h -> h, no bias) over
  the base's ``hidden_states`` at ``layer_ids`` (specheads' EAGLE-3 convention: index 0 is the embeddings, index k
  the output of decoder layer k; ids are distinct, ascending and in ``[1, L - 1]``, what every engine can capture).
* layer l: ``k = k_norm(k_proj(ctx))``, ``v = v_proj(ctx)`` (the context does not pass ``input_layernorm``); the
  block's queries, keys and values are the usual ones of ``input_layernorm(h)``; RoPE on the block's queries and on
  all keys at their own positions.
* ``norm``, then the base's frozen lm_head (the full vocabulary). The base's embedding reads the block's tokens.
  Neither is stored with the heads.

Slot layouts:

* DFlash (``sample_from_anchor`` false): slot 0 is the anchor; slot k >= 1 predicts the token at ``a + k``:
  ``block_size - 1`` drafts.
* DSpark (``sample_from_anchor`` true): slot k predicts the token at ``a + k + 1``: ``block_size`` drafts. A
  low-rank Markov head adds ``markov_w2(markov_w1[previous token])`` to slot k's logits (the previous token is the
  anchor for slot 0, then the token drafted, or in training the true token, at the slot before), and a confidence
  head ``sigmoid(proj([h_k ; markov_w1[previous]]))`` estimates whether the slot's draft survives verification.

The module names are the engines' (speculators, vLLM, SGLang, z-lab's ``dflash``), so the state dict is the
exported tensor names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from specheads.methods.api_decode import (
    Calibration,
    DraftHeads,
    base_layer_shape,
    base_model_info,
    vocab_size,
)

VARIANTS = ("dflash", "dspark")


@dataclass
class DFlashConfig:
    """Hyper-parameters of a block drafter and the shape of the base it belongs to (see the module docstring).

    ``layer_ids`` are ``hidden_states`` indices; ``mask_token_id`` is the id whose embedding fills the block's
    mask slots (a row of the base's embedding); ``markov_rank`` and ``confidence_head`` are DSpark's.
    """

    variant: str = "dflash"
    hidden_size: int = 0
    vocab_size: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    rope_parameters: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    max_position_embeddings: int = 2048
    num_layers: int = 2
    layer_ids: list[int] = field(default_factory=list)
    block_size: int = 8
    mask_token_id: int = 0
    markov_rank: int = 0
    confidence_head: bool = False
    base_model: dict[str, Any] = field(default_factory=dict)
    head_type: str = "dflash"

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"block drafter variant {self.variant!r}; choose one of {list(VARIANTS)}")
        check_block_size(self.block_size)
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise ValueError(f"num_layers must be an integer >= 1, got {self.num_layers!r}")
        layers = int(self.base_model.get("num_hidden_layers") or 0)
        if layers:
            check_layer_ids(self.layer_ids, layers)
        elif not self.layer_ids:
            raise ValueError("a block drafter reads at least one feature layer (layer_ids is empty)")
        check_mask_token(self.mask_token_id, self.vocab_size)
        if self.variant == "dspark":
            if isinstance(self.markov_rank, bool) or not isinstance(self.markov_rank, int) or self.markov_rank < 1:
                raise ValueError(f"DSpark's Markov head needs markov_rank >= 1, got {self.markov_rank!r}")
        elif self.markov_rank or self.confidence_head:
            raise ValueError("markov_rank and confidence_head are DSpark settings (variant='dspark')")

    @property
    def sample_from_anchor(self) -> bool:
        """Every slot predicts (DSpark); else slot 0 is the anchor and only the mask slots predict (DFlash)."""
        return self.variant == "dspark"

    @property
    def num_drafts(self) -> int:
        """Tokens one block drafts: ``block_size`` (DSpark) or ``block_size - 1`` (DFlash)."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    @property
    def first_slot(self) -> int:
        """The block slot of draft depth 1 (0 for DSpark, 1 for DFlash)."""
        return 0 if self.sample_from_anchor else 1

    def layer_config(self) -> LlamaConfig:
        """The transformers config of the draft layers' MLP, norms and rotary embedding."""
        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters=dict(self.rope_parameters),
            max_position_embeddings=self.max_position_embeddings,
        )


def check_block_size(block_size: Any) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
        raise ValueError(f"block_size must be an integer >= 2 (the anchor and at least one mask), got {block_size!r}")
    return block_size


def check_mask_token(mask_token_id: Any, vocab: int) -> int:
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int) or not 0 <= mask_token_id < vocab:
        raise ValueError(f"mask_token_id must be a token id in [0, {vocab - 1}] (a row of the base's embedding), "
                         f"got {mask_token_id!r}")  # fmt: skip
    return mask_token_id


def check_layer_ids(layer_ids: Sequence[int], num_hidden_layers: int) -> list[int]:
    """Feature layers of a block drafter: distinct, ascending ``hidden_states`` indices in ``[1, L - 1]``.

    Index 0 (the embeddings) and L (the last layer after the final norm) are not what the engines capture.
    """
    ids = list(layer_ids)
    valid = all(isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= num_hidden_layers - 1 for i in ids)
    if not ids or not valid or ids != sorted(set(ids)):
        raise ValueError(
            f"layer_ids {ids}: a block drafter reads distinct, ascending hidden_states indices in "
            f"[1, {num_hidden_layers - 1}] (the base has {num_hidden_layers} decoder layers)"
        )
    return ids


def default_layer_ids(num_hidden_layers: int, num_layers: int) -> list[int]:
    """z-lab's choice, as ``hidden_states`` indices: one feature per draft layer, spread over layers 1 .. L - 3 (one
    feature, the middle layer, for a one-layer draft); clamped into ``[1, L - 1]`` and made distinct."""
    if num_hidden_layers < 2:
        raise ValueError(f"a block drafter needs a base with at least 2 decoder layers, got {num_hidden_layers}")
    if num_layers == 1:
        ids = [num_hidden_layers // 2]
    else:
        end = max(num_hidden_layers - 3, 1)
        ids = [round(1 + i * (end - 1) / (num_layers - 1)) for i in range(num_layers)]
    return sorted({min(max(i + 1, 1), num_hidden_layers - 1) for i in ids})


def resolve_mask_token(base: PreTrainedModel, tokenizer: Any = None) -> int:
    """The mask token: the tokenizer's mask token, else a spare embedding row (ids past the tokenizer's), else pad,
    else eos (speculators' order), the last two from the tokenizer or else the base's config."""
    vocab = vocab_size(base)
    if tokenizer is not None:
        mask = getattr(tokenizer, "mask_token_id", None)
        if isinstance(mask, int) and 0 <= mask < vocab:
            return mask
        if len(tokenizer) < vocab:
            return len(tokenizer)
    for name in ("pad_token_id", "eos_token_id"):
        for source in (tokenizer, base.config):
            value = getattr(source, name, None) if source is not None else None
            value = value[0] if isinstance(value, list) and value else value
            if isinstance(value, int) and 0 <= value < vocab:
                return value
    return 0


class RMSNorm(LlamaRMSNorm):
    """Qwen3's RMSNorm (the same computation as Llama's)."""


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``[B, heads, T, d]`` with ``cos``/``sin`` ``[B, T, d]`` of the same positions."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashAttention(nn.Module):
    """Qwen3 attention whose keys and values are the context's and the block's (see the module docstring)."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        hidden, head_dim = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
        )
        self.q_proj = nn.Linear(hidden, self.num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(head_dim, eps=config.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, kv_heads, T, d]`` rotated keys and values of ``x`` (``[B, T, h]``: the context or the block)."""
        batch, length, _ = x.shape
        keys = self.k_norm(self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        values = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(keys, cos, sin), values

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        context: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: Any = None,
        layer_idx: int = 0,
    ) -> torch.Tensor:
        """The block's attention output.

        Args:
            hidden: ``[B, Q, h]`` the block (after ``input_layernorm``).
            cos, sin: ``[B, Q, d]`` rotary tables at the block's positions.
            mask: ``[B or 1, 1, Q, keys]`` bool, True where a query sees a key (None: everything).
            context: ``(keys, values)`` ``[B, kv_heads, C, d]`` of the context, placed before the block's keys; or
            cache: a :class:`~specheads.inference.kv_cache.SlotCache` holding the context of each row: the block's
                keys and values are written after each row's context (and never committed) and attention reads both.
        """
        batch, length, _ = hidden.shape
        queries = self.q_norm(self.q_proj(hidden).view(batch, length, self.num_heads, self.head_dim)).transpose(1, 2)
        queries = apply_rotary(queries, cos, sin)
        keys, values = self.keys_values(hidden, cos, sin)
        if cache is not None:
            keys, values = cache.update(keys, values, layer_idx)
        elif context is not None:
            keys, values = torch.cat([context[0], keys], dim=2), torch.cat([context[1], values], dim=2)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class DFlashLayer(nn.Module):
    """A Qwen3 decoder layer with context injection: norms, :class:`DFlashAttention`, SwiGLU MLP."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = LlamaMLP(config.layer_config())
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                context: tuple[torch.Tensor, torch.Tensor] | None = None, cache: Any = None,
                layer_idx: int = 0) -> torch.Tensor:  # fmt: skip
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, mask, context, cache, layer_idx)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class MarkovHead(nn.Module):
    """DSpark's vanilla Markov head: a rank-r bias ``W2 W1[previous token]`` on the next slot's logits."""

    def __init__(self, vocab: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)

    def forward(self, previous: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(self.markov_w1(previous))


class ConfidenceHead(nn.Module):
    """DSpark's confidence head: the logit of "this slot's draft survives", from ``[h_k ; W1[previous]]``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class DFlashHead(DraftHeads):
    """A DFlash or DSpark block drafter (see the module docstring).

    Args:
        config: the drafter's hyper-parameters and base shape.
        base_model: the base whose embedding and lm_head the drafter reads; bind it later with :meth:`attach_base`.
    """

    config_class = DFlashConfig
    family = "block"
    bound_as = "this block drafter"

    def __init__(self, config: DFlashConfig, base_model: PreTrainedModel | None = None) -> None:
        super().__init__()
        self.config = config
        self.calibration: Calibration | None = None  # set by load_heads when a tree.json is present
        hidden = config.hidden_size
        self.fc = nn.Linear(len(config.layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config.layer_config())
        if config.variant == "dspark":
            self.markov_head = MarkovHead(config.vocab_size, config.markov_rank)
            self.confidence_head = ConfidenceHead(hidden + config.markov_rank) if config.confidence_head else None
        else:
            self.markov_head = None
            self.confidence_head = None
        self._base = [None]  # bound by bind_base
        if base_model is not None:
            self.bind_base(base_model)

    @classmethod
    def from_base(
        cls,
        base_model: PreTrainedModel,
        variant: str = "dflash",
        layer_ids: Sequence[int] | None = None,
        num_layers: int = 2,
        block_size: int = 8,
        mask_token_id: int | None = None,
        tokenizer: Any = None,
        markov_rank: int = 64,
        confidence_head: bool = True,
    ) -> DFlashHead:
        """A randomly initialised block drafter sized for ``base_model``.

        Args:
            base_model: the frozen base.
            variant: ``"dflash"`` or ``"dspark"`` (Markov and confidence heads, every slot predicts).
            layer_ids: the ``hidden_states`` indices to fuse (default: one per draft layer, spread as z-lab does).
            num_layers: draft decoder layers.
            block_size: slots of one block (>= 2): DFlash drafts ``block_size - 1`` tokens, DSpark ``block_size``.
            mask_token_id: the mask slots' token (default: the tokenizer's mask token, a spare embedding row,
                pad, or eos).
            tokenizer: the base's tokenizer, for the default mask token.
            markov_rank: DSpark: rank r of the Markov head.
            confidence_head: DSpark: train a confidence head.
        """
        if variant not in VARIANTS:
            raise ValueError(f"block drafter variant {variant!r}; choose one of {list(VARIANTS)}")
        num_hidden = int(getattr(base_model.config, "num_hidden_layers", 0) or base_model.config.n_layer)
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be an integer >= 1, got {num_layers!r}")
        ids = default_layer_ids(num_hidden, num_layers) if layer_ids is None else list(layer_ids)
        config = DFlashConfig(
            variant=variant,
            vocab_size=vocab_size(base_model),
            num_layers=num_layers,
            layer_ids=check_layer_ids(ids, num_hidden),
            block_size=check_block_size(block_size),
            mask_token_id=resolve_mask_token(base_model, tokenizer) if mask_token_id is None else mask_token_id,
            markov_rank=markov_rank if variant == "dspark" else 0,
            confidence_head=bool(confidence_head) and variant == "dspark",
            base_model=base_model_info(base_model),
            **base_layer_shape(base_model),
        )
        head = cls(config)
        head.apply(head._init_weights)
        if head.markov_head is not None:
            nn.init.zeros_(head.markov_head.markov_w2.weight)  # the Markov bias starts at zero: the plain marginals
        head.bind_base(base_model)
        return head.to(device=base_model.get_output_embeddings().weight.device)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    # ------------------------------------------------------------------ the base
    @property
    def hidden_state_layers(self) -> tuple[int, ...]:
        """The ``hidden_states`` indices the drafter reads from the base."""
        return tuple(self.config.layer_ids)

    # ------------------------------------------------------------------ the computation
    def fuse(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """``[B, T, h]`` the context, ``hidden_norm(fc(features))``, from the base's hidden states."""
        dtype = self.fc.weight.dtype
        return self.hidden_norm(self.fc(torch.cat([f.to(dtype) for f in features], dim=-1)))

    def rotary(self, like: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` ``[B, T, d]`` at ``positions`` (``[B, T]``)."""
        return self.rotary_emb(like, positions)

    def context_keys_values(
        self, context: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the context's rotated keys and values ``[B, kv_heads, C, d]``."""
        cos, sin = self.rotary(context, positions)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]

    def block_inputs(self, anchors: torch.Tensor) -> torch.Tensor:
        """``[..., S]`` block tokens ``[anchor, mask, ..., mask]`` for anchor tokens ``[...]``."""
        block = anchors.new_full((*anchors.shape, self.config.block_size), self.config.mask_token_id)
        block[..., 0] = anchors
        return block

    def blocks(
        self,
        block_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        context: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        cache: Any = None,
    ) -> torch.Tensor:
        """The draft layers over blocks: ``[B, Q, h]`` normed hidden states of ``block_ids`` ``[B, Q]``.

        Args:
            block_ids: ``[B, Q]`` block tokens (one or several blocks per row, side by side).
            positions: ``[B, Q]`` their positions.
            mask: ``[B or 1, 1, Q, keys]`` bool: which context keys and block keys each query sees.
            context: per layer, the context's keys and values (training: the whole sequence's); or
            cache: the rows' context in a SlotCache (decoding).
        """
        embedding = self.base_model_of().get_input_embeddings()
        hidden = embedding(block_ids).to(self.fc.weight.dtype)
        cos, sin = self.rotary(hidden, positions)
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, cos, sin, mask, None if context is None else context[index], cache, index)
        return self.norm(hidden)

    def lm_head(self) -> nn.Module:
        """The base's (frozen) lm_head, which reads every slot."""
        return self.base_model_of().get_output_embeddings()

    def slot_logits(self, hidden: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., V]`` logits of slots' hidden states; DSpark adds the Markov bias of each slot's ``previous``
        token (required for DSpark; ignored for DFlash)."""
        lm_head = self.lm_head()
        logits = lm_head(hidden.to(lm_head.weight.dtype)).to(hidden.dtype)
        if self.markov_head is not None:
            if previous is None:
                raise ValueError("DSpark's slot logits need each slot's previous token (the Markov head's input)")
            logits = logits + self.markov_head(previous).to(logits.dtype)
        return logits

    def markov_bias(self, previous: torch.Tensor) -> torch.Tensor | None:
        """``[..., V]`` the Markov head's bias for tokens ``previous`` (None for DFlash)."""
        return None if self.markov_head is None else self.markov_head(previous)

    def confidence_logits(self, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor | None:
        """``[...]`` the confidence head's logits (None without one)."""
        if self.confidence_head is None:
            return None
        return self.confidence_head(torch.cat([hidden, self.markov_head.markov_w1(previous).to(hidden.dtype)], -1))

    def forward(
        self,
        input_ids: torch.Tensor,
        features: Sequence[torch.Tensor],
        anchors: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Blocks at many anchors of whole sequences at once (training and evaluation).

        Every row's context is its whole sequence; the block of anchor ``a`` (``[x_a, mask...]`` at positions
        ``a .. a + S - 1``) sees the context at positions ``< a`` (real tokens only) and its own block.

        Args:
            input_ids: ``[B, T]`` the sequences.
            features: the base's ``hidden_states`` at :attr:`hidden_state_layers`, each ``[B, T, h]``.
            anchors: ``[B, N]`` anchor positions per row (``0 <= a``; slots past ``T`` are allowed and ignored by
                the caller).
            attention_mask: ``[B, T]`` 1 for real tokens (None: all real).

        Returns:
            ``[B, N, S, h]`` the normed hidden state of every slot of every block.
        """
        batch, length = input_ids.shape
        count, size = anchors.shape[1], self.config.block_size
        device = input_ids.device
        context = self.fuse(features)
        positions = torch.arange(length, device=device)[None].expand(batch, length)
        keys_values = self.context_keys_values(context, positions)
        block_ids = self.block_inputs(input_ids.gather(1, anchors)).flatten(1)  # [B, N * S]
        block_positions = (anchors[:, :, None] + torch.arange(size, device=device)).flatten(1)
        real = torch.ones(batch, length, dtype=torch.bool, device=device)
        if attention_mask is not None:
            real = attention_mask.bool()
        sees_context = (torch.arange(length, device=device)[None, None] < anchors[:, :, None]) & real[:, None]
        sees_context = sees_context[:, :, None].expand(batch, count, size, length).reshape(batch, count * size, length)
        block_of = torch.arange(count * size, device=device) // size
        sees_block = (block_of[:, None] == block_of[None, :])[None].expand(batch, -1, -1)
        mask = torch.cat([sees_context, sees_block], dim=-1)[:, None]
        hidden = self.blocks(block_ids, block_positions, mask, context=keys_values)
        return hidden.view(batch, count, size, -1)
