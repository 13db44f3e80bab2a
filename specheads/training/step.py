"""The seam between the trainer and a method's training step: a typed context in, a typed result out.

For every micro-batch the trainer builds a :class:`StepContext` (what a method may read of the run: its step and
epoch, its recipe section, whether this micro-batch's metrics are logged, the base, the heads and the accelerator)
and calls the method's ``train_step(context, batch)`` (named by its registry entry, resolved once per run), which
returns a :class:`StepResult`: the loss to back-propagate and the metrics to log. A method never sees the trainer's
own state.

The frozen base's output for the micro-batch (one forward, or the feature cache's rows when the batch carries them)
comes through :meth:`StepContext.base_features`, called with the layers the method's heads declare, as the decoder
gathers the features a drafter declares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from specheads.training.features import base_output

if TYPE_CHECKING:
    from accelerate import Accelerator

    from specheads.training.config import LoraConfig


@dataclass(frozen=True)
class StepContext:
    """What a method's training step reads of the run, for one micro-batch.

    Attributes:
        step: optimizer steps done before this micro-batch (0 on the first).
        epoch: the epoch this micro-batch belongs to (0-based: micro-batches seen // micro-batches per epoch).
        seed: the recipe's ``train.seed`` (a method that draws at random seeds its own generators from it).
        section: the recipe's ``heads`` section, the method's own dataclass (its registry entry's ``recipe``).
        joint: the recipe's ``lora`` section when the base trains jointly with the heads (``lora.enabled``,
            Medusa-2; only for a method whose entry says ``joint_training``), else None: the base is frozen.
        log_metrics: this micro-batch's metrics are logged: a method computes costly metrics (top-k agreement)
            only then.
        base: the base model, as prepared (a peft model under joint training, a sharded module under FSDP).
        heads: the heads, as prepared: call this module for the forward (a DDP/FSDP wrapper must see it);
            :attr:`module` is the heads themselves.
        accelerator: the run's ``accelerate.Accelerator``.
    """

    step: int
    epoch: int
    seed: int
    section: Any
    joint: LoraConfig | None
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
    ) -> tuple[list[torch.Tensor], Any]:
        """The base's output for ``batch`` (one forward, or the feature cache's rows) and, in float32, its
        ``hidden_states[layer]`` for each of ``layers`` (the layers the heads read).

        Args:
            batch: the micro-batch (``input_ids``, ``attention_mask``; ``hidden.<layer>`` from a feature cache).
            layers: indices into the base's ``hidden_states`` (``-1``: the final state, which the lm_head reads).
            full_logits: see :func:`~specheads.training.features.base_output`.
            grad: run the forward with gradients (the base trains jointly with the heads); without, no graph.
            kwargs: passed to the base's forward (``logits_to_keep``).

        Returns:
            ``(features, output)``: one ``[B, T, H]`` tensor per layer, and the base's output (``logits``,
            ``hidden_states``).
        """
        with torch.set_grad_enabled(grad):
            out = base_output(self.base, batch, full_logits=full_logits, **kwargs)
        return [out.hidden_states[layer].float() for layer in layers], out


@dataclass
class StepResult:
    """What a method's training step returns for one micro-batch.

    Attributes:
        loss: the scalar loss to back-propagate (connected to the heads' parameters).
        metrics: named floats the trainer logs beside ``loss`` (``head_0/top1``, ``step_0/agreement``, ...).
    """

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
