"""The optimizer and the learning-rate schedule of a training run (``train.optimizer``, ``train.schedule``).

Optimizers:

* ``adamw`` (the default): one ``torch.optim.AdamW`` over the trainer's parameter groups.
* ``muon``: vLLM speculators' split (``speculators/train/optimizers.py``, after Keller Jordan's Muon):
  ``torch.optim.Muon`` on the 2-D hidden weight matrices (``fc``, attention, MLP) at ``train.muon_lr_multiplier``
  x ``train.lr``, with momentum 0.95 (Nesterov), weight decay ``train.muon_weight_decay`` and its step scaled to
  AdamW's update size (``adjust_lr_fn="match_rms_adamw"``, speculators' default); AdamW at ``train.lr`` on the rest:
  norms, biases, and the embedding-like and vocabulary matrices (``lm_head``: Muon orthogonalises hidden
  transformations, not rows that stand for tokens).

Schedules: ``cosine``, ``linear`` and ``constant`` are transformers' (``get_scheduler``; ``constant`` has no
warmup). ``wsd`` is warmup-stable-decay (Hu et al. 2024, MiniCPM, arXiv 2404.06395): a linear warmup over
``train.warmup_steps``, the peak learning rate, then a linear decay to zero over the last ``train.decay_fraction``
of the steps. A continued run (``train.init_from``) with ``train.warmup_steps=0`` starts at the peak: no re-warm.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from transformers import get_scheduler, get_wsd_schedule

from specheads.training.config import ConfigError, TrainConfig

# 2-D parameters that stand for tokens (an embedding, a vocabulary projection, a low-rank vocabulary factor) go to
# AdamW even though they are matrices, as in speculators' split.
NOT_MUON = ("embed", "lm_head", "markov_w1", "markov_w2")
MUON_MOMENTUM = 0.95
MUON_ADJUST_LR = "match_rms_adamw"


def muon_split(module: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """``(matrices, others)``: the trainable parameters of ``module`` that Muon takes, and the rest (for AdamW).

    A parameter goes to Muon iff it is a 2-D matrix with both sides > 1, not an ``nn.Embedding``'s weight and not
    named like a token matrix (:data:`NOT_MUON`).
    """
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    matrices, others = [], []
    for name, parameter in module.named_parameters():
        if not parameter.requires_grad:
            continue
        hidden_matrix = parameter.ndim == 2 and min(parameter.shape) > 1 and id(parameter) not in embeddings
        if hidden_matrix and not any(hint in name for hint in NOT_MUON):
            matrices.append(parameter)
        else:
            others.append(parameter)
    return matrices, others


class MuonWithAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` on ``matrices`` and ``torch.optim.AdamW`` on ``others``, stepped as one optimizer.

    One object for Accelerate, the schedule and checkpoints: :attr:`param_groups` are the two optimizers' own groups
    (AdamW's first, so a logged ``lr`` is the base one), so a scheduler that sets their ``lr`` sets it in both.

    Args:
        matrices: the parameters for Muon (2-D, see :func:`muon_split`).
        others: the parameters for AdamW.
        lr: AdamW's learning rate.
        weight_decay: AdamW's weight decay.
        muon_lr: Muon's learning rate (before its ``match_rms_adamw`` scaling by ``0.2 * sqrt(max(rows, cols))``).
        muon_weight_decay: Muon's (decoupled) weight decay.
    """

    def __init__(
        self,
        matrices: Iterable[nn.Parameter],
        others: Iterable[nn.Parameter],
        lr: float,
        weight_decay: float,
        muon_lr: float,
        muon_weight_decay: float,
    ) -> None:
        matrices, others = list(matrices), list(others)
        self.parts: list[torch.optim.Optimizer] = []
        if others:
            self.parts.append(torch.optim.AdamW(others, lr=lr, weight_decay=weight_decay))
        if matrices:
            muon = torch.optim.Muon(
                matrices,
                lr=muon_lr,
                weight_decay=muon_weight_decay,
                momentum=MUON_MOMENTUM,
                adjust_lr_fn=MUON_ADJUST_LR,
            )
            self.parts.append(muon)
        super().__init__([group for part in self.parts for group in part.param_groups], {})

    def _link_groups(self) -> None:
        # The parts' own group dicts: loading a state dict replaces them, and the schedule must reach the new ones.
        self.param_groups = [group for part in self.parts for group in part.param_groups]

    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts:
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        parts = state_dict.get("parts")
        if not isinstance(parts, list) or len(parts) != len(self.parts):
            raise ValueError("not a state dict of this Muon + AdamW optimizer (another train.optimizer?)")
        for part, state in zip(self.parts, parts, strict=True):
            part.load_state_dict(state)
        self._link_groups()


def build_optimizer(train: TrainConfig, groups: list[dict[str, Any]], heads: nn.Module) -> torch.optim.Optimizer:
    """The run's optimizer (see the module docstring).

    Args:
        train: the recipe's ``train`` section.
        groups: the trainer's parameter groups, each with its ``lr`` (``adamw``).
        heads: the heads, whose matrices Muon takes (``muon``, which trains the heads alone on a frozen base).
    """
    if train.optimizer == "adamw":
        return torch.optim.AdamW(groups, weight_decay=train.weight_decay)
    trained = {id(p) for group in groups for p in group["params"]}
    matrices, others = muon_split(heads)
    if trained != {id(p) for p in matrices + others}:
        raise ConfigError("train.optimizer=muon trains the heads alone: every trainable parameter must be theirs")
    return MuonWithAdamW(
        matrices,
        others,
        lr=train.lr,
        weight_decay=train.weight_decay,
        muon_lr=train.lr * train.muon_lr_multiplier,
        muon_weight_decay=train.muon_weight_decay,
    )


def build_scheduler(train: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    """The learning-rate schedule over ``total_steps`` optimizer steps (see the module docstring).

    Raises:
        ConfigError: ``wsd`` whose warmup and decay together are longer than the run.
    """
    if train.schedule != "wsd":
        return get_scheduler(
            train.schedule, optimizer, num_warmup_steps=train.warmup_steps, num_training_steps=total_steps
        )
    decay_steps = round(train.decay_fraction * total_steps)
    if train.warmup_steps + decay_steps > total_steps:
        raise ConfigError(
            f"train.schedule=wsd: train.warmup_steps={train.warmup_steps} and train.decay_fraction="
            f"{train.decay_fraction} ({decay_steps} decay steps) need more than the run's {total_steps} steps"
        )
    return get_wsd_schedule(
        optimizer,
        num_warmup_steps=train.warmup_steps,
        num_decay_steps=decay_steps,
        num_training_steps=total_steps,
        warmup_type="linear",
        decay_type="linear",
    )
