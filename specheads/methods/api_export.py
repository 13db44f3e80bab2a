"""What a method needs to export: the record its formats are listed in, the shared writer and checker helpers, the
serve commands, the messages.

One of the three phase modules of the method API (:mod:`specheads.methods.api` says which holds what). Each name is
documented where it is defined.
"""

from __future__ import annotations

from specheads.export.check import (
    CheckReport,
    EngineVerdict,
    config_architectures,
    id_list,
    nonzero_bias,
    tensor_problems,
    unknown_tensors,
)
from specheads.export.formats import (
    SPECULATORS_VERSION,
    ExportResult,
    check_heads,
    llamacpp_command,
    serving_engines,
    speculative_tokens,
    vllm_command,
)

# Messages: the pip command that installs an optional dependency a format needs (e.g. gguf), for this install.
from specheads.extras import install_hint
from specheads.heads.checkpoint import WEIGHTS_NAME as SAFETENSORS_WEIGHTS
from specheads.heads.foreign import shape_error
from specheads.registry import ExportFormat, FolderContents, FolderReader

__all__ = [
    "SAFETENSORS_WEIGHTS",
    "SPECULATORS_VERSION",
    "CheckReport",
    "EngineVerdict",
    "ExportFormat",
    "ExportResult",
    "FolderContents",
    "FolderReader",
    "check_heads",
    "config_architectures",
    "id_list",
    "install_hint",
    "llamacpp_command",
    "nonzero_bias",
    "serving_engines",
    "shape_error",
    "speculative_tokens",
    "tensor_problems",
    "unknown_tensors",
    "vllm_command",
]
