"""Everything a method folder may use from the rest of specheads, in one place.

A method (``specheads/methods/<name>/``) imports from specheads only this module and its own folder; the registry
entry (:mod:`specheads.registry`) names the folder's parts. The structural test of the suite holds every method to
that, so this list is the whole contract between the engine and a method. Each name is documented where it is
defined; the groups below say what it is for.
"""

from __future__ import annotations

# Checkpoints: the heads base class and its storage, the fingerprint of the base, calibration records.
from specheads.export.check import (
    CheckReport,
    EngineVerdict,
    config_architectures,
    id_list,
    nonzero_bias,
    tensor_problems,
    unknown_tensors,
)

# Export: the record a method's formats are listed in, the shared writer helpers, the serve commands.
from specheads.export.formats import (
    SPECULATORS_VERSION,
    ExportResult,
    check_heads,
    llamacpp_command,
    serving_engines,
    speculative_tokens,
    vllm_command,
)

# Messages: the pip command that installs an optional dependency a method needs (e.g. gguf), for this install.
from specheads.extras import install_hint
from specheads.heads.calibration import Calibration
from specheads.heads.checkpoint import WEIGHTS_NAME as SAFETENSORS_WEIGHTS
from specheads.heads.checkpoint import (
    DraftHeads,
    HeadCheckpointError,
    base_model_info,
    load_module_state,
    save_checkpoint,
)
from specheads.heads.foreign import shape_error
from specheads.heads.vocab import (
    check_draft_map,
    draft_maps,
    draft_vocab_coverage,
    draft_vocab_size_for_coverage,
    select_draft_vocab,
)

# Decoding: the drafter protocol, the decode state it reads, trees, the feature queue, the draft cache, sampling.
from specheads.inference import kv_cache
from specheads.inference.drafters import (
    Drafter,
    DraftModelDrafter,
    chain_proposal,
    check_chain_request,
    check_speculative_tokens,
    requested_tree,
)
from specheads.inference.feature_queue import FeatureQueue
from specheads.inference.sampling import probabilities, sample
from specheads.inference.state import DecodeState, DraftRequest, Proposal
from specheads.inference.trees import (
    BlockTree,
    DynamicTree,
    TreeBuffers,
    TreeFamily,
    chain_choices,
    dynamic_parameters,
    resolve_tree,
    tree_from_choices,
    tree_from_parents,
)

# The base: its vocabulary and the dimensions a draft layer copies from it.
from specheads.loading import base_layer_shape, vocab_size
from specheads.registry import ExportFormat, Readout

# Training: recipe errors, the step's typed context and result, the base's features and teacher, the shared losses,
# held-out agreement.
from specheads.training.config import ConfigError
from specheads.training.evaluate import RANKS, agreement_summary
from specheads.training.features import base_output, teacher_logits
from specheads.training.losses import (
    TeacherLogits,
    distillation_loss,
    flat_rows,
    linear_cross_entropy,
    lm_loss,
    projected_top_k,
)
from specheads.training.step import StepContext, StepResult

__all__ = [
    "RANKS",
    "SAFETENSORS_WEIGHTS",
    "SPECULATORS_VERSION",
    "BlockTree",
    "Calibration",
    "CheckReport",
    "ConfigError",
    "DecodeState",
    "DraftHeads",
    "DraftModelDrafter",
    "DraftRequest",
    "Drafter",
    "DynamicTree",
    "EngineVerdict",
    "ExportFormat",
    "ExportResult",
    "FeatureQueue",
    "HeadCheckpointError",
    "Proposal",
    "Readout",
    "StepContext",
    "StepResult",
    "TeacherLogits",
    "TreeBuffers",
    "TreeFamily",
    "agreement_summary",
    "base_layer_shape",
    "base_model_info",
    "base_output",
    "chain_choices",
    "chain_proposal",
    "check_chain_request",
    "check_draft_map",
    "check_heads",
    "check_speculative_tokens",
    "config_architectures",
    "distillation_loss",
    "draft_maps",
    "draft_vocab_coverage",
    "draft_vocab_size_for_coverage",
    "dynamic_parameters",
    "flat_rows",
    "id_list",
    "install_hint",
    "kv_cache",
    "linear_cross_entropy",
    "llamacpp_command",
    "lm_loss",
    "load_module_state",
    "nonzero_bias",
    "probabilities",
    "projected_top_k",
    "requested_tree",
    "resolve_tree",
    "sample",
    "save_checkpoint",
    "select_draft_vocab",
    "serving_engines",
    "shape_error",
    "speculative_tokens",
    "teacher_logits",
    "tensor_problems",
    "tree_from_choices",
    "tree_from_parents",
    "unknown_tensors",
    "vllm_command",
    "vocab_size",
]
