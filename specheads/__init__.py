"""specheads: lossless speculative decoding for any transformers causal LM."""

from specheads.heads import EagleHead, HeadCheckpointError, MedusaHeads, load_heads
from specheads.inference import (
    DraftModelDrafter,
    GenerationOutput,
    NoDrafter,
    PromptLookupDrafter,
    SpecDecoder,
    TreeError,
)
from specheads.inference.eagle import EagleDrafter
from specheads.inference.trees import DynamicTree
from specheads.metrics import SpecStats

__version__ = "0.1.0"

__all__ = [
    "DraftModelDrafter",
    "DynamicTree",
    "EagleDrafter",
    "EagleHead",
    "HeadCheckpointError",
    "MedusaHeads",
    "GenerationOutput",
    "NoDrafter",
    "PromptLookupDrafter",
    "SpecDecoder",
    "SpecStats",
    "TreeError",
    "__version__",
    "load_heads",
]
