"""Medusa's part of the trainer: building heads and the loss of one micro-batch (Medusa-1 and Medusa-2)."""

from __future__ import annotations

from typing import Any

import torch

from specheads.methods.api import (
    StepContext,
    StepResult,
    distillation_loss,
    lm_loss,
)
from specheads.methods.medusa.config import HeadsConfig
from specheads.methods.medusa.heads import MedusaHeads
from specheads.methods.medusa.joint import LoraJointTraining
from specheads.methods.medusa.losses import medusa2_head_weights, medusa_head_loss, stack_head_losses


def build_heads(base: torch.nn.Module, section: HeadsConfig, dataset: Any) -> MedusaHeads:
    """Fresh fp32 Medusa heads for ``base`` (Medusa-1 heads start from copies of its lm_head)."""
    return MedusaHeads.from_base(
        base, num_heads=section.num_heads, num_layers=section.num_layers, share_lm_head=section.share_lm_head
    ).float()


def train_step(context: StepContext, batch: dict[str, torch.Tensor]) -> StepResult:
    """The loss of one micro-batch: one base forward for all heads (with gradients only in Medusa-2's joint stage:
    ``context.joint`` is the run's :class:`LoraJointTraining` and the step is past ``lora.stage1_steps``).

    No head's ``[B, T, V]`` logits are built: the heads' forward hands each head's projection to
    :func:`medusa_head_loss`, which scores a chunk of positions at a time; the base's own losses (Medusa-2) are
    computed in chunks of its logits.
    """
    lora = _lora(context)
    input_ids, attention, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    joint = isinstance(context.joint, LoraJointTraining) and context.joint.trains_base(context.step)
    # the state the base's lm_head reads [B, T, H] (or the feature cache's); all logits only for Medusa-2's own loss
    (hidden,), out = context.base_features(batch, (-1,), grad=joint, logits_to_keep=0 if lora is not None else 1)

    def head_loss(head: int, states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
        # called inside the heads' forward with head k's projection: scored a chunk of positions at a time
        return medusa_head_loss(states, input_ids, loss_mask, head, weight, bias, accuracy=context.log_metrics)

    head_losses = stack_head_losses(context.heads(hidden, readout=head_loss))
    if lora is not None:
        ramp = lora.head_weight_warmup_steps
        schedule = min(1.0, (context.step + 1) / ramp) if ramp else 1.0
        weights = medusa2_head_weights(len(head_losses.loss), lora.head_weight, lora.head_decay, schedule).to(
            head_losses.loss.device
        )
        loss = (weights * head_losses.loss).sum()
        if joint:
            loss = loss + lora.lm_loss_weight * _base_loss(context, out.logits, input_ids, attention, loss_mask)
    else:
        loss = head_losses.loss.sum()  # Medusa-1: the heads' losses add up
    metrics = {}
    for head in range(len(head_losses.loss)):
        metrics[f"head_{head}/loss"] = float(head_losses.loss[head].detach())
        metrics[f"head_{head}/top1"] = float(head_losses.top1[head])
        metrics[f"head_{head}/top5"] = float(head_losses.top5[head])
    # each head's loss is a mean over its targets: head 0's count weighs them (head k counts k fewer a row at most)
    return StepResult(loss, metrics, weight=float(head_losses.count[0]))


def _base_loss(
    context: StepContext,
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    loss_mask: torch.Tensor,
) -> torch.Tensor:
    """Medusa-2's loss of the base itself: the next-token CE, or the KL to the adapter-free base
    (``lora.self_distillation``)."""
    if not _lora(context).self_distillation:
        return lm_loss(logits, input_ids, loss_mask)
    model = context.accelerator.unwrap_model(context.base)
    with torch.no_grad(), context.joint.original(model):
        teacher = model(input_ids=input_ids, attention_mask=attention).logits
    return distillation_loss(logits, teacher, loss_mask)


def _lora(context: StepContext) -> Any:
    """The recipe's ``lora`` section under Medusa-2's joint training, else None (Medusa-1: a frozen base)."""
    return context.joint.lora if isinstance(context.joint, LoraJointTraining) else None
