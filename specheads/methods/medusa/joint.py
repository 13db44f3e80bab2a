"""Medusa-2's joint training: peft LoRA adapters on the base, trained with the heads (the recipe's ``lora`` section).

The registry entry names :class:`LoraJointTraining` as Medusa's ``joint_training``; the trainer calls its hooks (the
:class:`specheads.training.step.JointTraining` protocol) and names none of its settings: ``from_recipe`` reads
``lora.*``, ``prepare`` adds the adapters to the frozen base, ``param_groups`` gives the heads their faster learning
rate, ``original`` is the base without the adapter (the held-out cost of fine-tuning it), ``save`` writes the adapter
beside the exported heads and ``bind`` merges it into the base those heads decode with. The loss itself
(``L = lm_w * L_LM + sum_k w0 * decay^k * schedule * L_k``, heads only for ``lora.stage1_steps`` steps) is
:func:`specheads.methods.medusa.train.train_step`'s.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch


@dataclass(frozen=True)
class LoraJointTraining:
    """Medusa-2 (Cai et al. 2024, "Medusa-2"): the base fine-tuned by LoRA adapters jointly with the heads.

    Attributes:
        lora: the recipe's ``lora`` section (rank, targets, stage-1 steps, the loss weights).
        heads_lr_multiplier: the heads' learning rate over the adapters' (``train.heads_lr_multiplier``).
    """

    lora: Any
    heads_lr_multiplier: float
    setting: ClassVar[str] = "lora.enabled"  # the recipe setting that turns joint training on, for messages

    @classmethod
    def from_recipe(cls, recipe: Any) -> LoraJointTraining | None:
        """The hooks of a recipe with ``lora.enabled``; None: its heads train on a frozen base (Medusa-1)."""
        if not recipe.lora.enabled:
            return None
        return cls(recipe.lora, recipe.train.heads_lr_multiplier)

    def prepare(self, base: torch.nn.Module) -> torch.nn.Module:
        """The frozen base wrapped in fresh LoRA adapters (B = 0: the base's outputs are unchanged until they train);
        the adapters are its only trainable parameters."""
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=self.lora.r,
            lora_alpha=self.lora.alpha,
            lora_dropout=self.lora.dropout,
            target_modules=self.lora.target_modules,
            task_type="CAUSAL_LM",
            modules_to_save=["lm_head"] if self.lora.include_lm_head else None,
        )
        return get_peft_model(base, config)

    def param_groups(self, base: torch.nn.Module, heads: torch.nn.Module, lr: float) -> list[dict[str, Any]]:
        """The heads at ``lr`` x ``heads_lr_multiplier``, then the adapters at ``lr`` (``train.lr``)."""
        return [
            {"params": [p for p in heads.parameters() if p.requires_grad], "lr": lr * self.heads_lr_multiplier},
            {"params": [p for p in base.parameters() if p.requires_grad], "lr": lr},
        ]

    def trains_base(self, step: int) -> bool:
        """Whether the micro-batches of optimizer step ``step`` (0-based) train the base: past stage one."""
        return step >= self.lora.stage1_steps

    def original(self, base: torch.nn.Module) -> AbstractContextManager[Any]:
        """A context in which the prepared ``base`` computes as the base it was given to :meth:`prepare`."""
        return base.disable_adapter()

    def save(self, base: torch.nn.Module, directory: Path) -> None:
        """Write the adapter of the prepared (unwrapped) ``base`` into ``directory`` (peft's ``save_pretrained``)."""
        base.save_pretrained(str(directory))

    @staticmethod
    def bind(directory: Path, base: torch.nn.Module) -> torch.nn.Module:
        """The base with the adapter :meth:`save` wrote into ``directory`` merged into its weights, in eval mode."""
        from peft import PeftModel

        return PeftModel.from_pretrained(base, str(directory)).merge_and_unload().eval()
