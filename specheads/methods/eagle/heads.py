"""EAGLE draft heads (Li et al. 2024: EAGLE-1 arXiv 2401.15077, EAGLE-3 arXiv 2503.01840) on a frozen base.

An EAGLE head is one Llama-style decoder layer (RMSNorm, rotary attention, SwiGLU MLP) with the base's hidden size,
attention heads, kv heads, head_dim and rope settings, whatever the base's own architecture: that is what EAGLE's
code and the serving engines build for every target. It drafts at the *feature* level: at position t it reads the
embedding of token t + 1 and a feature of position t, and outputs a hidden state that stands for the feature of
position t + 1, from which the next token is read. Drafting deeper feeds that output back as the next feature.

What a "feature" is (exports and imports depend on it; ``hidden_states`` is the tuple transformers returns with
``output_hidden_states=True``: index 0 = the embeddings, index k = the output of decoder layer k, and the last index
L = num_hidden_layers = the last layer's output *after* the base's final norm, what its lm_head reads):

* ``version=1``: the feature is ``hidden_states[L]``, after the final norm (as in EAGLE's own training data, which
  takes transformers' ``hidden_states[-1]``, and in vLLM/SGLang, whose targets hand over the normed last state).
  ``fc = Linear(2h -> h)`` over ``[embedding(token t+1) ; feature t]``, then the layer *without* its input norm,
  and no final norm: the base's own (frozen) lm_head reads the output.
* ``version=3``: three features ``hidden_states[i]`` for ``i in layer_ids`` (default low/middle/high
  ``(2, L // 2, L - 3)``, vLLM's convention; SGLang/SpecForge ids are one less), fused by ``fc = Linear(3h -> h,
  no bias)``. The layer's attention reads ``[input_layernorm(embedding) ; hidden_norm(feature)]`` (2h wide); the
  output passes a final ``norm`` and an own ``lm_head`` over a reduced draft vocabulary: draft id ``d`` is target
  id ``d + d2t[d]``, and ``t2d[t]`` says whether target id t is in the draft vocabulary.

  EAGLE 3.1 (speculators' ``fc_norm`` and ``norm_output``, read by vLLM and SGLang as well) adds two norms, each off by
  default: ``fc_norm`` an RMSNorm on each fused feature before ``fc`` (one per layer, ``fc_norm.{k}``), and
  ``norm_output`` feeds the *normed* output (``norm(hidden)``, what the lm_head reads) to the next draft step.
  ``norm_before_fc`` (speculators' and llama.cpp's ``input_norm``, NVIDIA's EAGLE-3 v3 drafts) is the one fused-feature
  norm llama.cpp's graph runs: a single RMSNorm over the concatenated ``3h`` features before ``fc`` (``input_norm``);
  it excludes ``fc_norm``.

The base's embedding (and for version 1 its lm_head) is used frozen and never stored in the head checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from specheads.methods.api_decode import (
    Calibration,
    DraftHeads,
    HeadCheckpointError,
    Readout,
    base_layer_shape,
    base_model_info,
    check_draft_map,
    draft_maps,
    layer_kwargs,
    new_cache,
    select_draft_vocab,
    vocab_size,
)


@dataclass
class EagleConfig:
    """Hyper-parameters of an EAGLE head and the shape of the base it belongs to.

    ``layer_ids`` are indices into the base's ``hidden_states`` (see the module docstring); version 1 reads one
    feature, ``[num_hidden_layers]`` (after the final norm).
    """

    version: int = 3
    hidden_size: int = 0
    vocab_size: int = 0
    draft_vocab_size: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    rope_parameters: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    max_position_embeddings: int = 2048
    layer_ids: list[int] = field(default_factory=list)
    fc_bias: bool = False
    norm_before_residual: bool = False
    fc_norm: bool = False  # EAGLE 3.1: an RMSNorm on each fused feature before fc (version 3)
    norm_output: bool = False  # EAGLE 3.1: the next draft step reads norm(output), not the output (version 3)
    norm_before_fc: bool = False  # one RMSNorm over the concatenated 3h features before fc (version 3; llama.cpp's)
    base_model: dict[str, Any] = field(default_factory=dict)
    head_type: str = "eagle"

    def __post_init__(self) -> None:
        if self.version not in (1, 3):
            raise ValueError(f"EAGLE version must be 1 or 3, got {self.version!r}")
        expected = 1 if self.version == 1 else 3
        if len(self.layer_ids) != expected:
            raise ValueError(f"EAGLE-{self.version} fuses {expected} feature layer(s), got layer_ids {self.layer_ids}")
        layers = int(self.base_model.get("num_hidden_layers") or 0)  # a loaded config: ids must fit its base
        if layers and self.version == 1 and self.layer_ids != [layers]:
            raise ValueError(f"EAGLE-1 reads the last feature, hidden_states[{layers}]; got layer_ids {self.layer_ids}")
        if layers and self.version == 3:
            check_layer_ids(self.layer_ids, layers)
        if self.version == 1 and self.draft_vocab_size != self.vocab_size:
            raise ValueError("EAGLE-1 reads tokens through the base's lm_head: no reduced draft vocabulary")
        if self.version == 1 and (self.fc_norm or self.norm_output or self.norm_before_fc):
            raise ValueError("fc_norm, norm_output and norm_before_fc are EAGLE-3 settings; EAGLE-1 has none of them")
        if self.fc_norm and self.norm_before_fc:
            raise ValueError(
                "fc_norm (a norm per fused layer) and norm_before_fc (one over all of them) exclude each other"
            )
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, {self.vocab_size}], got {self.draft_vocab_size}")

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size < self.vocab_size

    def llama_config(self) -> LlamaConfig:
        """The transformers config of the draft layer (Llama-style whatever the base is)."""
        config = LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters=dict(self.rope_parameters),
            max_position_embeddings=self.max_position_embeddings,
        )
        config._attn_implementation = "sdpa"  # takes the boolean tree masks the drafter builds
        return config


def default_layer_ids(num_hidden_layers: int) -> list[int]:
    """EAGLE-3's low/middle/high feature layers ``(2, L // 2, L - 3)``, clamped into ``[0, L - 1]`` (shallow bases)."""
    last = max(num_hidden_layers - 1, 0)
    return sorted([min(2, last), min(num_hidden_layers // 2, last), min(max(num_hidden_layers - 3, 0), last)])


def check_layer_ids(layer_ids: Sequence[int], num_hidden_layers: int) -> list[int]:
    """Fused feature layers must be ``hidden_states`` indices of the base's decoder layers: ``0 <= i < L``."""
    ids = list(layer_ids)
    for index in ids:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < num_hidden_layers:
            raise ValueError(
                f"EAGLE-3 layer_ids {ids}: each must be a hidden_states index in [0, {num_hidden_layers - 1}] "
                f"(the base has {num_hidden_layers} decoder layers; index 0 is the embeddings)"
            )
    return ids


class Eagle3Layer(nn.Module):
    """EAGLE-3's decoder layer: attention over ``[input_layernorm(embedding) ; hidden_norm(feature)]``.

    With ``norm_before_residual`` the residual is the normed feature (a variant some checkpoints use); by default it
    is the feature itself, as in EAGLE-3's own code.
    """

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False) -> None:
        super().__init__()
        self.norm_before_residual = norm_before_residual
        self.self_attn = LlamaAttention(config, layer_idx=0)
        width = 2 * config.hidden_size  # q/k/v read the embedding and the feature side by side
        attn = self.self_attn
        attn.q_proj = nn.Linear(width, config.num_attention_heads * attn.head_dim, bias=config.attention_bias)
        attn.k_proj = nn.Linear(width, config.num_key_value_heads * attn.head_dim, bias=config.attention_bias)
        attn.v_proj = nn.Linear(width, config.num_key_value_heads * attn.head_dim, bias=config.attention_bias)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Any,
    ) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        attended, _ = self.self_attn(
            torch.cat([self.input_layernorm(embeds), normed], dim=-1),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            **layer_kwargs(self.self_attn, cache),
        )
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleHead(DraftHeads):
    """An EAGLE-1 or EAGLE-3 draft head (see the module docstring for the exact inputs).

    Args:
        config: the head's hyper-parameters and base shape.
        base_model: the base whose embedding (and, for version 1, lm_head) the head reads; bind it later with
            :meth:`attach_base` when loading.
    """

    config_class = EagleConfig
    family = "EAGLE"  # with config.version, how messages name these heads (EAGLE-1, EAGLE-3)
    bound_as = "this EAGLE head"
    d2t: torch.Tensor | None  # buffers of a reduced draft vocabulary (see the module docstring), else None
    t2d: torch.Tensor | None

    def __init__(self, config: EagleConfig, base_model: PreTrainedModel | None = None) -> None:
        super().__init__()
        self.config = config
        self.calibration: Calibration | None = None  # set by load_heads when a tree.json is present
        self.fc_norm: nn.ModuleList | None = None
        self.input_norm: nn.Module | None = None
        hidden = config.hidden_size
        layer_config = config.llama_config()
        if config.version == 1:
            self.fc = nn.Linear(2 * hidden, hidden, bias=config.fc_bias)
            self.midlayer = LlamaDecoderLayer(layer_config, layer_idx=0)
            self.midlayer.input_layernorm = nn.Identity()  # EAGLE-1's layer has no input norm
            self.norm = None
            self.lm_head = None
        else:
            self.fc = nn.Linear(3 * hidden, hidden, bias=config.fc_bias)
            if config.fc_norm:  # one norm per fused layer, in layer_ids order (fc's column blocks)
                self.fc_norm = nn.ModuleList(
                    LlamaRMSNorm(hidden, eps=config.rms_norm_eps) for _ in range(len(config.layer_ids))
                )
            if config.norm_before_fc:  # one norm over the concatenation, in layer_ids order like fc's columns
                self.input_norm = LlamaRMSNorm(len(config.layer_ids) * hidden, eps=config.rms_norm_eps)
            self.midlayer = Eagle3Layer(layer_config, config.norm_before_residual)
            self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(layer_config)
        if config.reduced_vocab:
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        else:
            self.d2t = None
            self.t2d = None
        self._base = [None]  # bound by bind_base
        if base_model is not None:
            self.bind_base(base_model)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_base(
        cls,
        base_model: PreTrainedModel,
        version: int = 3,
        layer_ids: Sequence[int] | None = None,
        draft_vocab_size: int | None = None,
        fc_bias: bool | None = None,
        token_counts: torch.Tensor | None = None,
        norm_before_residual: bool = False,
        fc_norm: bool = False,
        norm_output: bool = False,
        intermediate_size: int | None = None,
        norm_before_fc: bool = False,
    ) -> EagleHead:
        """A randomly initialised head sized for ``base_model``.

        Args:
            base_model: the frozen base.
            version: 1 (EAGLE-1) or 3 (EAGLE-3).
            layer_ids: version 3: the three ``hidden_states`` indices to fuse (default ``(2, L // 2, L - 3)``).
            draft_vocab_size: version 3: size of the draft vocabulary (default: the base's whole vocabulary).
            fc_bias: a bias on fc (default: True for version 1, as EAGLE's repo and SGLang; False for version 3).
                vLLM's EAGLE-1 loader has no fc bias: train with ``fc_bias=False`` to serve there.
            token_counts: ``[V]`` token frequencies of the training data: the draft vocabulary is the most frequent
                ``draft_vocab_size`` tokens (ties and unseen tokens by id). Required when the vocabulary is reduced.
            norm_before_residual: version 3 layer variant (see :class:`Eagle3Layer`).
            fc_norm: version 3: an RMSNorm on each fused feature before fc (EAGLE 3.1).
            norm_output: version 3: the next draft step reads the normed output (EAGLE 3.1).
            norm_before_fc: version 3: one RMSNorm over the concatenated features before fc (llama.cpp runs it).
            intermediate_size: the draft layer's MLP width (default: the base's).
        """
        num_layers = int(getattr(base_model.config, "num_hidden_layers", 0) or base_model.config.n_layer)
        vocab = vocab_size(base_model)
        if version == 1:
            if layer_ids is not None or draft_vocab_size not in (None, vocab):
                raise ValueError("EAGLE-1 takes no layer_ids and no draft_vocab_size (it reads the last feature)")
            ids, draft_vocab = [num_layers], vocab
        elif version == 3:
            ids = check_layer_ids(default_layer_ids(num_layers) if layer_ids is None else layer_ids, num_layers)
            draft_vocab = vocab if draft_vocab_size is None else draft_vocab_size
            if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= vocab:
                raise ValueError(f"draft_vocab_size must be an integer in [1, {vocab}], got {draft_vocab_size!r}")
        else:
            raise ValueError(f"EAGLE version must be 1 or 3, got {version!r}")
        shape = base_layer_shape(base_model)
        if intermediate_size is not None:
            shape["intermediate_size"] = int(intermediate_size)
        config = EagleConfig(
            version=version,
            vocab_size=vocab,
            draft_vocab_size=draft_vocab,
            layer_ids=ids,
            fc_bias=(version == 1) if fc_bias is None else fc_bias,
            norm_before_residual=norm_before_residual,
            fc_norm=fc_norm,
            norm_output=norm_output,
            norm_before_fc=norm_before_fc,
            base_model=base_model_info(base_model),
            **shape,
        )
        head = cls(config)
        head.apply(head._init_weights)
        if config.reduced_vocab:
            if token_counts is None:
                raise ValueError("a reduced draft vocabulary needs token_counts of the training data")
            head.set_draft_vocab(select_draft_vocab(token_counts, draft_vocab))
        weight = base_model.get_output_embeddings().weight
        if head.lm_head is not None:  # start from the base's own projection of the draft tokens
            with torch.no_grad():
                head.lm_head.weight.copy_(weight[head.draft_token_ids().to(weight.device)].float())
        head.bind_base(base_model)
        return head.to(device=weight.device)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Set d2t/t2d from the sorted target ids of the draft vocabulary.

        Raises:
            ValueError: ids out of range, repeated, or not as many as ``draft_vocab_size``.
        """
        ids = torch.as_tensor(target_ids, dtype=torch.long).flatten()
        if ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"maps {ids.numel()} draft ids, expected {self.config.draft_vocab_size}")
        d2t, t2d = draft_maps(ids, self.config.vocab_size)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def draft_token_ids(self) -> torch.Tensor:
        """``[Vd]`` the target id of every draft id."""
        device = self.fc.weight.device
        ids = torch.arange(self.config.draft_vocab_size, device=device)
        return ids if self.d2t is None else ids + self.d2t

    # ------------------------------------------------------------------ the base
    @property
    def hidden_state_layers(self) -> tuple[int, ...]:
        """The ``hidden_states`` indices the head reads from the base."""
        return tuple(self.config.layer_ids)

    # ------------------------------------------------------------------ the computation
    def fuse(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """``[B, T, H]`` draft-ready features from the base's hidden states at :attr:`hidden_state_layers`."""
        dtype = self.fc.weight.dtype
        if self.config.version == 1:
            return features[0].to(dtype)
        features = [f.to(dtype) for f in features]
        if self.fc_norm is not None:
            features = [norm(f) for norm, f in zip(self.fc_norm, features, strict=True)]
        fused = torch.cat(features, dim=-1)
        return self.fc(fused if self.input_norm is None else self.input_norm(fused))

    def step(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Any,
    ) -> torch.Tensor:
        """One pass of the draft layer.

        Args:
            input_ids: ``[B, T]`` token t + 1 of each position.
            features: ``[B, T, H]`` the feature of each position (from :meth:`fuse`, or an earlier step's output).
            position_ids: ``[B, T]``.
            attention_mask: ``[B, 1, T, cached + T]`` bool, True where attention is allowed (None: one query).
            cache: the draft's own key/value cache (the drafter's :class:`~specheads.inference.kv_cache.SlotCache`, or
                a transformers ``DynamicCache`` in training-time unrolls and tests), extended in place.

        Returns:
            ``[B, T, H]`` the draft's output, standing for the feature of position t + 1 (with ``norm_output``, the
            normed output: the next step reads it and :meth:`logits` applies no second norm).
        """
        embeds = self.base_model_of().get_input_embeddings()(input_ids).to(features.dtype)
        position_embeddings = self.rotary_emb(features, position_ids)
        if self.config.version == 1:
            hidden = self.fc(torch.cat([embeds, features], dim=-1))
            return self.midlayer(
                hidden,
                attention_mask=attention_mask,
                position_embeddings=position_embeddings,
                **layer_kwargs(self.midlayer, cache),
            )
        hidden = self.midlayer(embeds, features, position_embeddings, attention_mask, cache)
        return self.norm(hidden) if self.config.norm_output else hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., Vd]`` draft-vocabulary logits of draft outputs (version 1: the base's lm_head, Vd = V)."""
        if self.config.version == 1:
            lm_head = self.base_model_of().get_output_embeddings()
            return lm_head(hidden.to(lm_head.weight.dtype))
        return self.lm_head(self._final_norm(hidden))

    def projection(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(inputs, weight, bias)`` with ``F.linear(inputs, weight, bias) == self.logits(hidden)``.

        Version 1: the base's lm_head reads ``hidden``; version 3: the head's own lm_head reads ``norm(hidden)``
        (with ``norm_output``, ``hidden`` itself: :meth:`step` already normed it).
        """
        if self.config.version == 1:
            lm_head = self.base_model_of().get_output_embeddings()
            return hidden.to(lm_head.weight.dtype), lm_head.weight, lm_head.bias
        return self._final_norm(hidden), self.lm_head.weight, None

    def _final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the lm_head reads of a step's output: ``norm(hidden)``, or ``hidden`` if :meth:`step` normed it."""
        return hidden if self.config.norm_output else self.norm(hidden)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target-vocabulary ids of draft-vocabulary ids."""
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def forward(
        self,
        input_ids: torch.Tensor,
        features: Sequence[torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        steps: int = 1,
        feature_noise: float = 0.0,
        readout: Readout | None = None,
    ) -> tuple[list[torch.Tensor], list[Any]]:
        """The draft unrolled on its own outputs over whole sequences ("training-time test", EAGLE-3).

        Index t of every output holds the draft at sequence position t (t = 0 .. T - 2). Step 0 reads token t + 1
        and the base's feature of position t and predicts token t + 2; step i reads token t + 1 + i and step i - 1's
        output at t, sits at position t + i, and predicts token t + 2 + i. Step i's query at t attends to step 0's
        keys at positions <= t (the committed prefix, as at decode time) and to steps 1..i at t (its own draft
        path), which is exactly the attention of a depth-(i + 1) node of a draft tree.

        Args:
            input_ids: ``[B, T]`` the sequence.
            features: the base's ``hidden_states`` at :attr:`hidden_state_layers`, each ``[B, T, H]``.
            attention_mask: ``[B, T]`` 1 for real tokens (None: all real).
            steps: how many draft steps to unroll (1 for EAGLE-1).
            feature_noise: width of uniform noise added to the base's features (EAGLE-1 training).
            readout: instead of step i's logits, return ``readout(i, *self.projection(hidden_i))``: a loss can then
                project a chunk of positions at a time (:func:`specheads.training.losses.linear_cross_entropy`) and
                no ``[B, T - 1, Vd]`` tensor is built. Called inside ``forward``, so that wrappers (DDP, FSDP) see
                every parameter used.

        Returns:
            ``(hidden, logits)``: per step, ``[B, T - 1, H]`` draft outputs and ``[B, T - 1, Vd]`` logits (or what
            ``readout`` returned).
        """
        batch, length = input_ids.shape
        span = length - 1
        hidden = self.fuse(features)[:, :span]  # [B, T - 1, H] the feature of position t
        if feature_noise:
            hidden = hidden + (torch.rand_like(hidden) - 0.5) * feature_noise
        device = input_ids.device
        real = torch.ones(batch, span, dtype=torch.bool, device=device)
        if attention_mask is not None:
            real = attention_mask[:, 1:].bool()  # token t + 1 is real
        eye = torch.eye(span, dtype=torch.bool, device=device)
        prefix = (torch.ones(span, span, dtype=torch.bool, device=device).tril()[None] & real[:, None, :]) | eye
        padded = torch.cat([input_ids, input_ids.new_zeros(batch, steps)], dim=1)  # tokens past the end: masked
        cache = new_cache()
        hiddens, logits = [], []
        for step in range(steps):
            mask = torch.cat([prefix] + [eye.expand(batch, span, span)] * step, dim=-1)[:, None]  # [B, 1, T-1, .]
            positions = torch.arange(step, step + span, device=device)[None].expand(batch, span)
            hidden = self.step(padded[:, 1 + step : 1 + step + span], hidden, positions, mask, cache)
            hiddens.append(hidden)
            logits.append(self.logits(hidden) if readout is None else readout(step, *self.projection(hidden)))
        return hiddens, logits

    # ------------------------------------------------------------------ checkpoints
    def check_loaded(self, where: str) -> None:
        """A loaded ``d2t`` must map every draft id to a distinct target id inside the vocabulary."""
        if self.d2t is not None:
            try:
                check_draft_map(self.draft_token_ids(), self.config.vocab_size, self.config.draft_vocab_size)
            except ValueError as error:
                raise HeadCheckpointError(f"{where}: d2t {error}") from error
