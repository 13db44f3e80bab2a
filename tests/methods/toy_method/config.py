"""The recipe section of the toy method."""

from __future__ import annotations

from dataclasses import dataclass

from specheads.methods.api_train import ConfigError


@dataclass
class ToyHeadsConfig:
    """The ``heads`` section of a toy recipe (``type: toy``): the depth of the drafted chain."""

    type: str = "toy"
    depth: int = 3

    def validate(self) -> None:
        if self.depth < 1:
            raise ConfigError(f"heads.depth must be >= 1, got {self.depth!r}")
