"""Medusa's part of the trainer: building heads and the loss of one micro-batch (Medusa-1 and Medusa-2)."""

from __future__ import annotations

from typing import Any

import torch

from specheads.methods.api import (
    base_output,
    distillation_loss,
    lm_loss,
    medusa2_head_weights,
    medusa_head_loss,
    stack_head_losses,
)
from specheads.methods.medusa.config import HeadsConfig
from specheads.methods.medusa.heads import MedusaHeads


def build_heads(base: torch.nn.Module, section: HeadsConfig, dataset: Any) -> MedusaHeads:
    """Fresh fp32 Medusa heads for ``base`` (Medusa-1 heads start from copies of its lm_head)."""
    return MedusaHeads.from_base(
        base, num_heads=section.num_heads, num_layers=section.num_layers, share_lm_head=section.share_lm_head
    ).float()


def train_step(run: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch: one base forward for all heads (with gradients only in Medusa-2's joint stage).

    No head's ``[B, T, V]`` logits are built: the heads' forward hands each head's projection to
    :func:`medusa_head_loss`, which scores a chunk of positions at a time; the base's own losses (Medusa-2) are
    computed in chunks of its logits.
    """
    config = run.config
    input_ids, attention, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    joint = config.lora.enabled and run.step >= config.lora.stage1_steps
    with torch.set_grad_enabled(joint):
        out = base_output(run.base, batch, logits_to_keep=0 if config.lora.enabled else 1)  # or the feature cache
    hidden = out.hidden_states[-1].float()  # [B, T, H] the state the base's lm_head reads

    def head_loss(head: int, states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
        # called inside the heads' forward with head k's projection: scored a chunk of positions at a time
        return medusa_head_loss(states, input_ids, loss_mask, head, weight, bias, accuracy=run.logging_step)

    head_losses = stack_head_losses(run.heads(hidden, readout=head_loss))
    if config.lora.enabled:
        ramp = config.lora.head_weight_warmup_steps
        schedule = min(1.0, (run.step + 1) / ramp) if ramp else 1.0
        weights = medusa2_head_weights(
            len(head_losses.loss), config.lora.head_weight, config.lora.head_decay, schedule
        ).to(head_losses.loss.device)
        loss = (weights * head_losses.loss).sum()
        if joint:
            loss = loss + config.lora.lm_loss_weight * _base_loss(run, out.logits, input_ids, attention, loss_mask)
    else:
        loss = head_losses.loss.sum()  # Medusa-1: the heads' losses add up
    metrics = {}
    for head in range(len(head_losses.loss)):
        metrics[f"head_{head}/loss"] = float(head_losses.loss[head].detach())
        metrics[f"head_{head}/top1"] = float(head_losses.top1[head])
        metrics[f"head_{head}/top5"] = float(head_losses.top5[head])
    return loss, metrics


def _base_loss(
    run: Any, logits: torch.Tensor, input_ids: torch.Tensor, attention: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    if not run.config.lora.self_distillation:
        return lm_loss(logits, input_ids, loss_mask)
    model = run.accelerator.unwrap_model(run.base)
    with torch.no_grad(), model.disable_adapter():
        teacher = model(input_ids=input_ids, attention_mask=attention).logits
    return distillation_loss(logits, teacher, loss_mask)
