"""What a method needs to decode: its heads' storage and the drafter's side of the engine.

One of the three phase modules of the method API (:mod:`specheads.methods.api` says which holds what). A method's
heads module and drafter import from specheads only this module (and their own folder), so that loading heads and
decoding with them import nothing from ``specheads.training`` or ``specheads.export``. Each name is documented where
it is defined; the groups below say what it is for.
"""

from __future__ import annotations

# Heads: the base class and its storage, the fingerprint of the base, calibration records, the draft vocabulary.
from specheads.heads.calibration import Calibration
from specheads.heads.checkpoint import (
    DraftHeads,
    HeadCheckpointError,
    base_model_info,
    load_module_state,
    save_checkpoint,
)
from specheads.heads.vocab import check_draft_map, draft_maps, select_draft_vocab

# Decoding: the drafter protocol, the decode state it reads, trees, the feature queue, sampling.
from specheads.inference.drafters import (
    Drafter,
    DraftModelDrafter,
    chain_proposal,
    check_chain_request,
    check_speculative_tokens,
    requested_tree,
)
from specheads.inference.feature_queue import FeatureQueue

# The draft's own key/value cache: a preallocated slot cache, rolled back and advanced by lengths.
from specheads.inference.kv_cache import (
    SlotCache,
    advance,
    crop,
    keep_rows,
    layer_kwargs,
    new_cache,
    to_device,
    tree_step_mask,
)
from specheads.inference.sampling import probabilities, sample
from specheads.inference.state import DecodeState, DraftRequest, Proposal
from specheads.inference.trees import (
    TreeBuffers,
    TreeError,
    TreeFamily,
    TreeSpec,
    chain_choices,
    resolve_tree,
    tree_from_choices,
    tree_from_parents,
)

# The base: its vocabulary and the dimensions a draft layer copies from it; what a head module's readout calls.
from specheads.loading import base_layer_shape, vocab_size
from specheads.registry import Readout

__all__ = [
    "Calibration",
    "DecodeState",
    "DraftHeads",
    "DraftModelDrafter",
    "DraftRequest",
    "Drafter",
    "FeatureQueue",
    "HeadCheckpointError",
    "Proposal",
    "Readout",
    "SlotCache",
    "TreeBuffers",
    "TreeError",
    "TreeFamily",
    "TreeSpec",
    "advance",
    "base_layer_shape",
    "base_model_info",
    "chain_choices",
    "chain_proposal",
    "check_chain_request",
    "check_draft_map",
    "check_speculative_tokens",
    "crop",
    "draft_maps",
    "keep_rows",
    "layer_kwargs",
    "load_module_state",
    "new_cache",
    "probabilities",
    "requested_tree",
    "resolve_tree",
    "sample",
    "save_checkpoint",
    "select_draft_vocab",
    "to_device",
    "tree_from_choices",
    "tree_from_parents",
    "tree_step_mask",
    "vocab_size",
]
