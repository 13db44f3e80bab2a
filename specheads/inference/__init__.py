"""Speculative decoding engine: decode loop, trees, acceptance rules, drafters and the cache seam."""

from specheads.inference.acceptance import ACCEPTANCE_RULES, AcceptanceOptions, AcceptResult
from specheads.inference.decoder import GenerationOutput, SpecDecoder
from specheads.inference.drafters import Drafter, DraftModelDrafter, NoDrafter, PromptLookupDrafter
from specheads.inference.generation import GenerationConfig
from specheads.inference.sampling import SamplingParams
from specheads.inference.state import DecodeState, DraftRequest, Proposal
from specheads.inference.trees import TreeBuffers, TreeError, resolve_tree

__all__ = [
    "ACCEPTANCE_RULES",
    "AcceptResult",
    "AcceptanceOptions",
    "DecodeState",
    "DraftModelDrafter",
    "DraftRequest",
    "Drafter",
    "GenerationConfig",
    "GenerationOutput",
    "NoDrafter",
    "PromptLookupDrafter",
    "Proposal",
    "SamplingParams",
    "SpecDecoder",
    "TreeBuffers",
    "TreeError",
    "resolve_tree",
]
