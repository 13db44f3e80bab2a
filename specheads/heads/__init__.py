"""Draft heads trained on top of a frozen base (Medusa, EAGLE-1/3, DFlash/DSpark block drafters), their checkpoints
and their registry.

Names are imported on first use (PEP 562): the registry alone does not need torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specheads._lazy import lazy_exports

_EXPORTS = {
    "HEAD_TYPES": "specheads.methods.registry",
    "DFlashConfig": "specheads.methods.dflash.heads",
    "DFlashHead": "specheads.methods.dflash.heads",
    "EagleConfig": "specheads.methods.eagle.heads",
    "EagleHead": "specheads.methods.eagle.heads",
    "HeadCheckpointError": "specheads.heads.checkpoint",
    "HeadType": "specheads.methods.registry",
    "MedusaConfig": "specheads.methods.medusa.heads",
    "MedusaHeads": "specheads.methods.medusa.heads",
    "head_type_of": "specheads.methods.registry",
    "heads_for_decoding": "specheads.heads.loading",
    "load_heads": "specheads.heads.loading",
}

__all__ = [
    "DFlashConfig",
    "DFlashHead",
    "EagleConfig",
    "EagleHead",
    "HEAD_TYPES",
    "HeadCheckpointError",
    "HeadType",
    "MedusaConfig",
    "MedusaHeads",
    "head_type_of",
    "heads_for_decoding",
    "load_heads",
]

if TYPE_CHECKING:
    from specheads.heads.checkpoint import HeadCheckpointError
    from specheads.heads.loading import heads_for_decoding, load_heads
    from specheads.methods.dflash.heads import DFlashConfig, DFlashHead
    from specheads.methods.eagle.heads import EagleConfig, EagleHead
    from specheads.methods.medusa.heads import MedusaConfig, MedusaHeads
    from specheads.methods.registry import HEAD_TYPES, HeadType, head_type_of


__getattr__, __dir__ = lazy_exports("specheads.heads", _EXPORTS, globals())
