"""One registry of head types: each names its module class, recipe section, builder, training step, evaluation and
drafter. Adding a head type means one entry here and its own modules; nothing else branches on the type.

Entries name their parts as ``"module:attribute"`` strings resolved on first use (as torchtune's ``_component_``
configs do), so that the heads package does not import the trainer or the engine at import time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this registry for its --help: torch loads only when a command needs it
    import torch

# What a head module's ``forward(..., readout=fn)`` calls instead of computing logits: ``fn(index, inputs, weight,
# bias)`` with ``F.linear(inputs, weight, bias)`` the logits of head / draft step ``index``; its results are returned.
Readout = Callable[[int, "torch.Tensor", "torch.Tensor", "torch.Tensor | None"], Any]


def _resolve(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class HeadType:
    """Where everything about one head type lives.

    Attributes:
        name: ``head_type`` in checkpoints, ``heads.type`` in recipes and the decoding ``method``.
        module: the ``nn.Module`` class (``from_base``, ``from_checkpoint``, ``save_pretrained``, ``attach_base``).
        recipe: the dataclass of the recipe's ``heads`` section.
        build: ``build(base, section, dataset) -> heads``: fresh heads for training.
        train_step: ``train_step(run, batch) -> (loss, metrics)``: the loss of one micro-batch, base in the loop.
        evaluate: ``evaluate(base, heads, batches, max_batches) -> dict``: held-out agreement with the base's
            greedy token per depth (``agreement_with_base_greedy``, ``agreement_by_rank``, ...).
        drafter: ``drafter(heads) -> Drafter``.
        bench_trees: the trees ``specheads bench`` decodes these heads with by default (rows ``<type>-<tree>``).
    """

    name: str
    module: str
    recipe: str
    build: str
    train_step: str
    evaluate: str
    drafter: str
    bench_trees: tuple[str, ...] = ()

    def module_class(self) -> type:
        return _resolve(self.module)

    def recipe_section(self) -> type:
        return _resolve(self.recipe)

    def build_heads(self, base: Any, section: Any, dataset: Any) -> Any:
        return _resolve(self.build)(base, section, dataset)

    def train_step_fn(self) -> Any:
        return _resolve(self.train_step)

    def evaluate_fn(self) -> Any:
        return _resolve(self.evaluate)

    def make_drafter(self, heads: Any, **kwargs: Any) -> Any:
        return _resolve(self.drafter)(heads, **kwargs)


HEAD_TYPES: dict[str, HeadType] = {
    "medusa": HeadType(
        name="medusa",
        module="specheads.heads.medusa:MedusaHeads",
        recipe="specheads.training.config:HeadsConfig",
        build="specheads.training.medusa:build_heads",
        train_step="specheads.training.medusa:train_step",
        evaluate="specheads.training.evaluate:head_agreement",
        drafter="specheads.inference.drafters:MedusaDrafter",
        bench_trees=("chain-2", "chain-3", "binary-7"),
    ),
    "eagle": HeadType(
        name="eagle",
        module="specheads.heads.eagle:EagleHead",
        recipe="specheads.training.config:EagleHeadsConfig",
        build="specheads.training.eagle:build_heads",
        train_step="specheads.training.eagle:train_step",
        evaluate="specheads.training.eagle:eagle_agreement",
        drafter="specheads.inference.eagle:EagleDrafter",
        bench_trees=("chain-3", "chain-5", "binary-7", "dynamic", "dynamic-4-5-16", "auto"),
    ),
    "draft-lm": HeadType(
        name="draft-lm",
        module="specheads.heads.draft:DraftLM",
        recipe="specheads.training.config:DraftHeadsConfig",
        build="specheads.training.draft:build_heads",
        train_step="specheads.training.draft:train_step",
        evaluate="specheads.training.draft:draft_agreement",
        drafter="specheads.heads.draft:draft_drafter",
    ),
}


def head_type_of(heads: Any) -> HeadType:
    """The registry entry of a heads module (by its config's ``head_type``)."""
    name = getattr(getattr(heads, "config", None), "head_type", None)
    if name not in HEAD_TYPES:
        raise ValueError(f"not a specheads heads module (head_type {name!r}); known: {sorted(HEAD_TYPES)}")
    return HEAD_TYPES[name]
