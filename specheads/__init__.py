"""specheads: lossless speculative decoding for any transformers causal LM.

The public names are imported on first use (PEP 562), so that ``import specheads`` and ``specheads --help`` do not
pay for torch and transformers until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "DraftModelDrafter": "specheads.inference.drafters",
    "DynamicTree": "specheads.inference.trees",
    "EagleDrafter": "specheads.inference.eagle",
    "EagleHead": "specheads.heads.eagle",
    "GenerationOutput": "specheads.inference.decoder",
    "HeadCheckpointError": "specheads.heads.checkpoint",
    "MedusaHeads": "specheads.heads.medusa",
    "NoDrafter": "specheads.inference.drafters",
    "PromptLookupDrafter": "specheads.inference.drafters",
    "SpecDecoder": "specheads.inference.decoder",
    "SpecStats": "specheads.metrics",
    "TreeError": "specheads.inference.trees",
    "load_heads": "specheads.heads.loading",
}

__all__ = [
    "DraftModelDrafter",
    "DynamicTree",
    "EagleDrafter",
    "EagleHead",
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
    from specheads.heads.eagle import EagleHead
    from specheads.heads.loading import load_heads
    from specheads.heads.medusa import MedusaHeads
    from specheads.inference.decoder import GenerationOutput, SpecDecoder
    from specheads.inference.drafters import DraftModelDrafter, NoDrafter, PromptLookupDrafter
    from specheads.inference.eagle import EagleDrafter
    from specheads.inference.trees import DynamicTree, TreeError
    from specheads.metrics import SpecStats


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specheads' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
