"""Draft heads trained on top of a frozen base (Medusa, EAGLE-1/3), their checkpoints and their registry."""

from specheads.heads.checkpoint import HeadCheckpointError
from specheads.heads.eagle import EagleConfig, EagleHead
from specheads.heads.loading import heads_for_decoding, load_heads
from specheads.heads.medusa import MedusaConfig, MedusaHeads
from specheads.heads.registry import HEAD_TYPES, HeadType, head_type_of

__all__ = [
    "HEAD_TYPES",
    "EagleConfig",
    "EagleHead",
    "HeadCheckpointError",
    "HeadType",
    "MedusaConfig",
    "MedusaHeads",
    "head_type_of",
    "heads_for_decoding",
    "load_heads",
]
