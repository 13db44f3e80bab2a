"""The seam between the trainer and a method's training step: a typed context in, a typed result out.

For every micro-batch the trainer builds a :class:`StepContext` (what a method may read of the run: its step and
epoch, its recipe section, whether this micro-batch's metrics are logged, the base, the heads and the accelerator)
and calls the method's ``train_step(context, batch)`` (named by its registry entry, resolved once per run), which
returns a :class:`StepResult`: the loss to back-propagate and the metrics to log. A method never sees the trainer's
own state.

The frozen base's view of the micro-batch (a :class:`~specheads.training.features.BaseView` of one forward, or of
the feature cache's rows when the batch carries them) comes through :meth:`StepContext.base_features`, called with
the layers the method's heads declare, as the decoder gathers the features a drafter declares.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch

from specheads.training.features import BaseView

if TYPE_CHECKING:
    from accelerate import Accelerator


@runtime_checkable
class JointTraining(Protocol):
    """A method's hooks for training the base jointly with its heads, e.g. Medusa-2's LoRA adapters.

    The method's registry entry names the class (``joint_training``); the trainer builds it from the recipe, calls
    these hooks and reads none of the method's settings; the method's step reads its own settings on it
    (:attr:`StepContext.joint`). Loading a checkpoint calls :meth:`bind`.

    Attributes:
        setting: the recipe setting that turns joint training on (``lora.enabled``), named in messages.
    """

    setting: ClassVar[str]

    @classmethod
    def from_recipe(cls, recipe: Any) -> JointTraining | None:
        """The hooks for ``recipe`` (a ``RecipeConfig``) when it trains the base; None: the base stays frozen."""
        ...

    def prepare(self, base: torch.nn.Module) -> torch.nn.Module:
        """The frozen base made trainable where joint training changes it (once, before the optimizer is built)."""
        ...

    def param_groups(self, base: torch.nn.Module, heads: torch.nn.Module, lr: float) -> list[dict[str, Any]]:
        """The optimizer's parameter groups, each with its ``lr``, over the heads and the prepared base (``lr``:
        ``train.lr``)."""
        ...

    def original(self, base: torch.nn.Module) -> AbstractContextManager[Any]:
        """A context in which the prepared base computes as the base it was before joint training."""
        ...

    def save(self, base: torch.nn.Module, directory: Path) -> None:
        """Write what joint training changed of the prepared (unwrapped) base into ``directory``."""
        ...

    @staticmethod
    def bind(directory: Path, base: torch.nn.Module) -> torch.nn.Module:
        """The base that heads saved with ``directory`` decode with: ``base`` changed as :meth:`save` recorded."""
        ...


@dataclass(frozen=True)
class StepContext:
    """What a method's training step reads of the run, for one micro-batch.

    Attributes:
        step: optimizer steps done before this micro-batch (0 on the first).
        epoch: the epoch this micro-batch belongs to (0-based: micro-batches seen // micro-batches per epoch).
        seed: the recipe's ``train.seed`` (a method that draws at random seeds its own generators from it).
        section: the recipe's ``heads`` section, the method's own dataclass (its registry entry's ``recipe``).
        joint: the method's :class:`JointTraining` hooks when the base trains jointly with the heads (built by
            its entry's ``joint_training`` from the recipe, e.g. Medusa-2's ``lora.enabled``), else None: the base
            is frozen.
        log_metrics: this micro-batch's metrics are logged: a method computes costly metrics (top-k agreement)
            only then.
        base: the base model, as prepared (by :meth:`JointTraining.prepare` under joint training, a sharded module
            under FSDP).
        heads: the heads, as prepared: call this module for the forward (a DDP/FSDP wrapper must see it);
            :attr:`module` is the heads themselves.
        accelerator: the run's ``accelerate.Accelerator``.
    """

    step: int
    epoch: int
    seed: int
    section: Any
    joint: JointTraining | None
    log_metrics: bool
    base: torch.nn.Module
    heads: torch.nn.Module
    accelerator: Accelerator

    @property
    def module(self) -> torch.nn.Module:
        """The heads without their DDP/FSDP wrapper (their config, buffers and helper methods)."""
        return self.accelerator.unwrap_model(self.heads)

    def base_features(
        self,
        batch: dict[str, torch.Tensor],
        layers: Sequence[int],
        full_logits: bool = True,
        grad: bool = False,
        **kwargs: Any,
    ) -> tuple[list[torch.Tensor], BaseView]:
        """The base's view of ``batch`` (one forward, or the feature cache's rows) and, in float32, its
        ``hidden_states[layer]`` for each of ``layers`` (the layers the heads read).

        Args:
            batch: the micro-batch (``input_ids``, ``attention_mask``; ``hidden.<layer>`` from a feature cache).
            layers: indices into the base's ``hidden_states`` (``-1``: the final state, which the lm_head reads).
            full_logits: see :meth:`~specheads.training.features.BaseView.of`.
            grad: run the forward with gradients (the base trains jointly with the heads); without, no graph.
            kwargs: passed to the base's forward (``logits_to_keep``).

        Returns:
            ``(features, view)``: one ``[B, T, H]`` tensor per layer, and the base's view of the batch
            (``logits``, ``hidden_states``, the teacher and the greedy tokens).
        """
        with torch.set_grad_enabled(grad):
            view = BaseView.of(self.base, batch, full_logits=full_logits, **kwargs)
        return [view.hidden(layer).float() for layer in layers], view


@dataclass
class StepResult:
    """What a method's training step returns for one micro-batch.

    Attributes:
        loss: the scalar loss to back-propagate (connected to the heads' parameters).
        metrics: named floats the trainer logs beside ``loss`` (``head_0/top1``, ``step_0/agreement``, ...).
        weight: how many targets ``loss`` is the mean over (the count its sum is divided by): its weight in an
            optimizer step of several micro-batches, which follows the mean over all their targets (see
            :func:`~specheads.training.trainer.train_batch`). None: the micro-batch's next-token targets
            (``loss_mask`` and ``attention_mask`` at positions 1 .. T - 1).
    """

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    weight: float | None = None
