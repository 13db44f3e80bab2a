"""Export heads to the layouts serving engines read (vLLM, SGLang, speculators, TGI, TensorRT-LLM, llama.cpp), check
exported folders against the engines' loading rules, and import heads published in those layouts (re-exported from
:mod:`specheads.heads.foreign`)."""

from specheads.export.check import CheckReport, EngineVerdict, check_export
from specheads.export.formats import FORMATS, ExportResult, export_heads
from specheads.heads.foreign import foreign_format, import_heads
from specheads.registry import detect_layout

__all__ = [
    "FORMATS",
    "CheckReport",
    "EngineVerdict",
    "ExportResult",
    "check_export",
    "detect_layout",
    "export_heads",
    "foreign_format",
    "import_heads",
]
