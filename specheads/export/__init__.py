"""Export heads to the layouts serving engines read (vLLM, SGLang, speculators, TGI, TensorRT-LLM folders, llama.cpp's
GGUF draft file), check exported folders and files against the engines' loading rules, and import heads published in
those layouts (the import lives in :mod:`specheads.heads.foreign` and is re-exported here)."""

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
