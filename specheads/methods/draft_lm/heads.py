"""A small draft model distilled from the base: a few of its own decoder layers over its embedding and lm_head.

For a base with no smaller sibling that shares its tokenizer (SmolLM2-135M has none), the draft-model mode needs a
draft made from the base itself. :meth:`DraftLM.from_base` builds one the way layer-dropping students are built
(DistilBERT's initialisation from the teacher's layers): the base's config with ``num_layers`` decoder layers,
initialised from the base's layers ``init_layers`` (default: evenly spaced from first to last), its final norm, and
its embedding and lm_head copied and frozen, so only the layers and the norm train. The trainer distils it with
``KL(base || draft)`` on the next-token distributions (``specheads.methods.draft_lm.train``).

Its checkpoint is at once a specheads checkpoint (``config.json`` with ``head_type: draft-lm``, ``model.safetensors``)
and an ordinary transformers model folder, so ``SpecDecoder.from_pretrained(base, draft_model=DIR)``, transformers'
``assistant_model`` and any engine's draft-model mode load it as it is.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from specheads.methods.api_decode import (
    DraftHeads,
    HeadCheckpointError,
    base_model_info,
    load_module_state,
    save_checkpoint,
)

DRAFT_FIELDS = ("head_type", "num_layers", "init_layers", "base_model")


@dataclass
class DraftConfig:
    """What a distilled draft records beside its transformers config."""

    num_layers: int
    init_layers: list[int]
    base_model: dict[str, Any] = field(default_factory=dict)
    head_type: str = "draft-lm"


def spaced_layers(total: int, count: int) -> list[int]:
    """``count`` distinct layer indices of ``total``, evenly spaced, first and last included."""
    if count == 1:
        return [total - 1]
    return sorted({round(i * (total - 1) / (count - 1)) for i in range(count)})


class DraftLM(DraftHeads):
    """A causal LM (``self.model``) distilled from a base; see the module docstring. Its checkpoint is a transformers
    model folder, so it overrides the native save and load."""

    config_class = DraftConfig
    family = "draft"
    bound_as = "this draft model"

    hidden_state_layers: tuple[int, ...] = ()  # the trainer's feature cache: only the base's final state is needed

    def __init__(self, config: DraftConfig, model: PreTrainedModel) -> None:
        super().__init__()
        self.config = config
        self.model = model

    @classmethod
    def from_base(
        cls, base_model: PreTrainedModel, num_layers: int = 2, init_layers: list[int] | None = None
    ) -> DraftLM:
        """A draft with ``num_layers`` of the base's decoder layers (indices ``init_layers``) and its frozen
        embedding and lm_head."""
        total = int(base_model.config.num_hidden_layers)
        if not 1 <= num_layers < total:
            raise ValueError(f"num_layers must be in 1..{total - 1} (the base has {total}), got {num_layers}")
        layers = list(init_layers) if init_layers is not None else spaced_layers(total, num_layers)
        if len(layers) != num_layers or len(set(layers)) != num_layers or not all(0 <= i < total for i in layers):
            raise ValueError(f"init_layers must be {num_layers} distinct layers of 0..{total - 1}, got {layers}")
        config = copy.deepcopy(base_model.config)
        config.num_hidden_layers = num_layers
        if getattr(config, "layer_types", None):
            config.layer_types = [config.layer_types[i] for i in layers]
        model = AutoModelForCausalLM.from_config(config).to(base_model.dtype)
        prefix = _layers_prefix(base_model)
        chosen = {str(theirs): str(mine) for mine, theirs in enumerate(layers)}
        state = {}
        for key, value in base_model.state_dict().items():  # everything but the layers left out, renumbered
            if key.startswith(prefix):
                index, _, rest = key[len(prefix) :].partition(".")
                if index not in chosen:
                    continue
                key = f"{prefix}{chosen[index]}.{rest}"
            state[key] = value
        model.load_state_dict(state, strict=False)  # tied lm_heads and non-persistent buffers may be absent
        draft = cls(DraftConfig(num_layers, layers, base_model_info(base_model)), model)
        draft.freeze_vocabulary()
        return draft

    def freeze_vocabulary(self) -> None:
        """The embedding and lm_head stay the base's: only the decoder layers and the final norm train."""
        self.model.get_input_embeddings().weight.requires_grad_(False)
        self.model.get_output_embeddings().weight.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T, H]`` the draft's final hidden states (its lm_head reads them)."""
        out = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state

    def save_pretrained(self, directory: str | Path) -> None:
        """Write the checkpoint: a transformers model folder whose ``config.json`` also holds the draft's record."""
        config = self.model.config.to_dict()
        config.update({key: value for key, value in asdict(self.config).items() if key in DRAFT_FIELDS})
        config["architectures"] = [type(self.model).__name__]
        state = self.model.state_dict()
        if self.model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_checkpoint(directory, config, state)

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor], where: str) -> DraftLM:
        record = DraftConfig(**{key: config[key] for key in DRAFT_FIELDS if key in config})
        model_config = {k: v for k, v in config.items() if k not in DRAFT_FIELDS and k != "specheads_version"}
        model_type = model_config.pop("model_type", None)
        if model_type is None:
            raise HeadCheckpointError(f"{where}: a draft checkpoint needs its transformers model_type")
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **model_config))
        if model.config.tie_word_embeddings:
            model.tie_weights()
            embedding = next(k for k, v in model.named_parameters() if v is model.get_input_embeddings().weight)
            tensors = {**tensors, "lm_head.weight": tensors[embedding]}
        draft = cls(record, model)
        load_module_state(draft.model, tensors, where)
        draft.freeze_vocabulary()
        return draft

    def to_drafter(self, **kwargs: Any) -> Any:
        from specheads.methods.api_decode import DraftModelDrafter

        return DraftModelDrafter(self.model, **kwargs)


def _layers_prefix(model: PreTrainedModel) -> str:
    """The state-dict prefix of the decoder layers (``model.layers.`` for Llama-likes, ``transformer.h.`` for GPT-2):
    the inner model's module list with one entry per layer."""
    total = int(model.config.num_hidden_layers)
    for name, module in model.base_model.named_children():
        if isinstance(module, torch.nn.ModuleList) and len(module) == total:
            return f"{model.base_model_prefix}.{name}."
    raise ValueError(f"{type(model).__name__}: no list of {total} decoder layers found to make a draft from")


def draft_drafter(heads: DraftLM, **kwargs: Any) -> Any:
    """The registry's drafter for a distilled draft: the draft-model drafter over its model."""
    return heads.to_drafter(**kwargs)
