"""specheads: lossless speculative decoding for any transformers causal LM.

The public names are imported on first use (PEP 562), so that ``import specheads`` and ``specheads --help`` do not
pay for torch and transformers until something needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specheads._lazy import lazy_exports
from specheads.registry import public_names

__version__ = "0.1.0"

_EXPORTS = {
    "DraftModelDrafter": "specheads.inference.drafters",
    "GenerationConfig": "specheads.inference.generation",
    "GenerationOutput": "specheads.inference.decoder",
    "HeadCheckpointError": "specheads.heads.checkpoint",
    "NoDrafter": "specheads.inference.drafters",
    "PromptLookup": "specheads.inference.lookup",
    "PromptLookupDrafter": "specheads.inference.drafters",
    "SpecDecoder": "specheads.inference.decoder",
    "SpecStats": "specheads.metrics",
    "TreeError": "specheads.inference.trees",
    "load_heads": "specheads.heads.loading",
    **public_names(),  # every method's heads, configs, drafters and grown trees, as their registry entries list them
}

__all__ = sorted([*_EXPORTS, "__version__"])

if TYPE_CHECKING:  # for type checkers: __all__ is built from the tables above
    from specheads.heads.checkpoint import HeadCheckpointError  # noqa: F401
    from specheads.heads.loading import load_heads  # noqa: F401
    from specheads.inference.decoder import GenerationOutput, SpecDecoder  # noqa: F401
    from specheads.inference.drafters import DraftModelDrafter, NoDrafter, PromptLookupDrafter  # noqa: F401
    from specheads.inference.generation import GenerationConfig  # noqa: F401
    from specheads.inference.lookup import PromptLookup  # noqa: F401
    from specheads.inference.trees import TreeError  # noqa: F401
    from specheads.metrics import SpecStats  # noqa: F401


__getattr__, __dir__ = lazy_exports("specheads", _EXPORTS, globals())
