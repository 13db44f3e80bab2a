"""specheads: lossless speculative decoding for any transformers causal LM.

The public names are imported on first use (PEP 562), so that ``import specheads`` and ``specheads --help`` do not
pay for torch and transformers until something needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specheads._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "BlockTree": "specheads.inference.trees",
    "DFlashDrafter": "specheads.methods.dflash.drafter",
    "DFlashHead": "specheads.methods.dflash.heads",
    "DraftModelDrafter": "specheads.inference.drafters",
    "DynamicTree": "specheads.inference.trees",
    "EagleDrafter": "specheads.methods.eagle.drafter",
    "EagleHead": "specheads.methods.eagle.heads",
    "GenerationConfig": "specheads.inference.generation",
    "GenerationOutput": "specheads.inference.decoder",
    "HeadCheckpointError": "specheads.heads.checkpoint",
    "MedusaHeads": "specheads.methods.medusa.heads",
    "NoDrafter": "specheads.inference.drafters",
    "PromptLookupDrafter": "specheads.inference.drafters",
    "SpecDecoder": "specheads.inference.decoder",
    "SpecStats": "specheads.metrics",
    "TreeError": "specheads.inference.trees",
    "load_heads": "specheads.heads.loading",
}

__all__ = [
    "BlockTree",
    "DFlashDrafter",
    "DFlashHead",
    "DraftModelDrafter",
    "DynamicTree",
    "EagleDrafter",
    "EagleHead",
    "GenerationConfig",
    "GenerationOutput",
    "HeadCheckpointError",
    "MedusaHeads",
    "NoDrafter",
    "PromptLookupDrafter",
    "SpecDecoder",
    "SpecStats",
    "TreeError",
    "__version__",
    "load_heads",
]

if TYPE_CHECKING:
    from specheads.heads.checkpoint import HeadCheckpointError
    from specheads.heads.loading import load_heads
    from specheads.inference.decoder import GenerationOutput, SpecDecoder
    from specheads.inference.drafters import DraftModelDrafter, NoDrafter, PromptLookupDrafter
    from specheads.inference.generation import GenerationConfig
    from specheads.inference.trees import BlockTree, DynamicTree, TreeError
    from specheads.methods.dflash.drafter import DFlashDrafter
    from specheads.methods.dflash.heads import DFlashHead
    from specheads.methods.eagle.drafter import EagleDrafter
    from specheads.methods.eagle.heads import EagleHead
    from specheads.methods.medusa.heads import MedusaHeads
    from specheads.metrics import SpecStats


__getattr__, __dir__ = lazy_exports("specheads", _EXPORTS, globals())
