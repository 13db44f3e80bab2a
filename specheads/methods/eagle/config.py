"""The recipe section of EAGLE heads."""

from __future__ import annotations

from dataclasses import dataclass

from specheads.methods.api import (
    ConfigError,
)


@dataclass
class EagleHeadsConfig:
    """The ``heads`` section of an EAGLE recipe (``type: eagle``).

    ``layer_ids`` are indices into the base's ``hidden_states`` (EAGLE-3 only; default low/middle/high
    ``(2, L // 2, L - 3)``). ``targets``: ``self`` trains on the base's own next-token distribution from the same
    forward (self-distillation, free); ``corpus`` on the data's tokens.
    """

    type: str = "eagle"
    version: int = 3
    layer_ids: list[int] | None = None
    draft_vocab_size: int | None = None  # EAGLE-3: the most frequent tokens of the training data (None: all)
    fc_bias: bool | None = None  # default: True for EAGLE-1 (EAGLE repo, SGLang), False for EAGLE-3; vLLM: false
    norm_before_residual: bool = False
    targets: str = "self"  # self | corpus
    ttt_steps: int = 7  # EAGLE-3 training-time test: the draft unrolled on its own outputs this many steps
    ttt_decay: float = 0.8  # step i's cross-entropy weighs decay^i
    feature_loss_weight: float = 1.0  # EAGLE-1: SmoothL1 on the predicted feature
    ce_loss_weight: float = 0.1  # EAGLE-1: cross-entropy through the frozen lm_head
    feature_noise: float = 0.2  # EAGLE-1: uniform noise of this width on the input features
    # EAGLE-3, self targets: add this much of TV(base, draft) = 1 - the draft's acceptance rate to every step's loss
    tv_loss_weight: float = 0.0

    def validate(self) -> None:
        if self.version not in (1, 3):
            raise ConfigError(f"heads.version is {self.version!r}; EAGLE versions are 1 and 3")
        if self.targets not in ("self", "corpus"):
            raise ConfigError(f"heads.targets is {self.targets!r}; choose one of ['corpus', 'self']")
        if self.version == 1 and (self.layer_ids is not None or self.draft_vocab_size is not None):
            raise ConfigError("heads.layer_ids and heads.draft_vocab_size are EAGLE-3 settings (heads.version=3)")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ConfigError(f"heads.draft_vocab_size must be >= 1, got {self.draft_vocab_size}")
        if self.layer_ids is not None and len(self.layer_ids) != 3:
            raise ConfigError(f"heads.layer_ids names 3 base layers (low, middle, high), got {self.layer_ids}")
        if self.ttt_steps < 1:
            raise ConfigError(f"heads.ttt_steps must be >= 1, got {self.ttt_steps}")
        if self.tv_loss_weight < 0 or (self.tv_loss_weight and (self.version != 3 or self.targets != "self")):
            raise ConfigError(
                f"heads.tv_loss_weight is {self.tv_loss_weight}: it must be >= 0, and it needs version 3 with self "
                "targets (the base's distribution)"
            )
        if self.feature_noise < 0:
            raise ConfigError(f"heads.feature_noise must be >= 0, got {self.feature_noise}")
