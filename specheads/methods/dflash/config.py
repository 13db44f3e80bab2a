"""The recipe section of block drafters (DFlash, DSpark)."""

from __future__ import annotations

from dataclasses import dataclass

from specheads.methods.api import (
    ConfigError,
)

LOSSES = ("kl", "ce", "dspark")
POSITION_WEIGHTS = ("decay", "dpace")


@dataclass
class DFlashHeadsConfig:
    """The ``heads`` section of a block-drafter recipe (``type: dflash``).

    ``variant``: ``dflash`` or ``dspark``. ``layer_ids`` are ``hidden_states`` indices (default: one per draft
    layer, spread as z-lab does). ``num_anchors``: blocks trained per sequence, their anchors drawn uniformly over
    the positions whose first draft target is a training target (16 suits a CPU, 512 a GPU).

    ``loss``: ``kl`` to the base's own distribution (``targets: self``, the default) or ``ce`` to the data's tokens
    (``targets: corpus``) for every slot; ``dspark`` is DeepSpec's ``0.1 CE + 0.9 L1(p_draft, p_base)``. Slot d
    weighs ``exp(-(d - 1) / decay_gamma)`` (``position_weights: decay``) or D-PACE's suffix sums of smoothed
    confidences (``dpace``, with ``dpace_alpha``). A confidence head adds ``confidence_weight * BCE(c, 1 - TV)``,
    TV the total variation between the draft's and the base's distributions, detached.
    """

    type: str = "dflash"
    variant: str = "dflash"
    num_layers: int = 2
    layer_ids: list[int] | None = None
    block_size: int = 8
    mask_token_id: int | None = None  # default: the tokenizer's mask token, a spare row, pad or eos
    markov_rank: int = 64  # dspark
    confidence_head: bool = True  # dspark
    num_anchors: int = 16
    targets: str = "self"  # self | corpus
    loss: str | None = None  # kl | ce | dspark (default: kl with self targets, ce with corpus; dspark for DSpark)
    position_weights: str = "decay"  # decay | dpace
    decay_gamma: float = 4.0
    dpace_alpha: float = 0.5
    confidence_weight: float = 1.0

    def validate(self) -> None:
        if self.variant not in ("dflash", "dspark"):
            raise ConfigError(f"heads.variant is {self.variant!r}; choose one of ['dflash', 'dspark']")
        if self.targets not in ("self", "corpus"):
            raise ConfigError(f"heads.targets is {self.targets!r}; choose one of ['corpus', 'self']")
        if self.loss is not None and self.loss not in LOSSES:
            raise ConfigError(f"heads.loss is {self.loss!r}; choose one of {list(LOSSES)}")
        if self.loss == "kl" and self.targets == "corpus":
            raise ConfigError("heads.loss=kl distils the base (heads.targets=self); with corpus targets use ce")
        if self.position_weights not in POSITION_WEIGHTS:
            raise ConfigError(f"heads.position_weights is {self.position_weights!r}; choose one of "
                              f"{list(POSITION_WEIGHTS)}")  # fmt: skip
        if self.block_size < 2:
            raise ConfigError(f"heads.block_size must be >= 2 (the anchor and a mask), got {self.block_size}")
        if self.num_layers < 1:
            raise ConfigError(f"heads.num_layers must be >= 1, got {self.num_layers}")
        if self.num_anchors < 1:
            raise ConfigError(f"heads.num_anchors must be >= 1, got {self.num_anchors}")
        if self.decay_gamma <= 0:
            raise ConfigError(f"heads.decay_gamma must be > 0, got {self.decay_gamma}")
        if not 0 <= self.dpace_alpha <= 1:
            raise ConfigError(f"heads.dpace_alpha must be in [0, 1], got {self.dpace_alpha}")
        if self.variant == "dspark" and self.markov_rank < 1:
            raise ConfigError(f"heads.markov_rank must be >= 1 for DSpark, got {self.markov_rank}")

    @property
    def resolved_loss(self) -> str:
        if self.loss is not None:
            return self.loss
        if self.variant == "dspark":
            return "dspark"
        return "kl" if self.targets == "self" else "ce"
