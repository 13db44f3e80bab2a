"""The recipe section of a distilled draft model."""

from __future__ import annotations

from dataclasses import dataclass

from specheads.methods.api import (
    ConfigError,
)


@dataclass
class DraftHeadsConfig:
    """The ``heads`` section of a distilled draft model (``type: draft-lm``): ``num_layers`` of the base's decoder
    layers, initialised from its layers ``init_layers`` (default: evenly spaced), over its frozen embedding and
    lm_head; trained with KL to the base's next-token distribution."""

    type: str = "draft-lm"
    num_layers: int = 2
    init_layers: list[int] | None = None

    def validate(self) -> None:
        if self.num_layers <= 0:
            raise ConfigError(f"heads.num_layers must be > 0, got {self.num_layers!r}")
