"""Export heads to the layouts serving engines read (vLLM, SGLang, speculators, TGI, TensorRT-LLM), check exported
directories against the engines' loading rules, and import heads published in those layouts."""

from specheads.export.check import CheckReport, EngineVerdict, check_export, detect_format
from specheads.export.formats import FORMATS, ExportResult, export_heads, foreign_format, import_heads

__all__ = [
    "FORMATS",
    "CheckReport",
    "EngineVerdict",
    "ExportResult",
    "check_export",
    "detect_format",
    "export_heads",
    "foreign_format",
    "import_heads",
]
