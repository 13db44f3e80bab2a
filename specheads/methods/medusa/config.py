"""The recipe section of Medusa heads."""

from __future__ import annotations

from dataclasses import dataclass

from specheads.methods.api import (
    ConfigError,
)


@dataclass
class HeadsConfig:
    """The ``heads`` section of a Medusa recipe (``type: medusa``)."""

    type: str = "medusa"
    num_heads: int = 4
    num_layers: int = 1
    share_lm_head: bool = False

    def validate(self) -> None:
        for key in ("num_heads", "num_layers"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"heads.{key} must be > 0, got {getattr(self, key)!r}")


MedusaHeadsConfig = HeadsConfig
