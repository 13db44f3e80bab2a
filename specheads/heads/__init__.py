"""Draft heads trained on top of a frozen base: Medusa today, EAGLE next."""

from specheads.heads.checkpoint import HeadCheckpointError
from specheads.heads.medusa import MedusaConfig, MedusaHeads, load_heads

__all__ = ["HeadCheckpointError", "MedusaConfig", "MedusaHeads", "load_heads"]
