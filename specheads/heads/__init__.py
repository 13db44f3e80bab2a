"""Draft heads trained on top of a frozen base: their checkpoints (:mod:`~specheads.heads.checkpoint`), loading of
any registered type or engine layout (:mod:`~specheads.heads.loading`, :mod:`~specheads.heads.foreign`), the
calibration record they carry (:mod:`~specheads.heads.calibration`) and draft vocabularies
(:mod:`~specheads.heads.vocab`). The heads themselves live in their method folders; their public classes
(``EagleHead``, ``MedusaHeads``, ``DFlashHead``, ``DraftLM``, their configs and drafters) are exported here by the
registry's ``public`` lists.

Names are imported on first use (PEP 562): the registry alone does not need torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specheads._lazy import lazy_exports
from specheads.registry import public_names

_EXPORTS = {
    "Calibration": "specheads.heads.calibration",
    "HEAD_TYPES": "specheads.registry",
    "HeadCheckpointError": "specheads.heads.checkpoint",
    "HeadType": "specheads.registry",
    "head_type_of": "specheads.registry",
    "heads_for_decoding": "specheads.heads.loading",
    "load_heads": "specheads.heads.loading",
    **public_names(),
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers: __all__ is built from the tables above
    from specheads.heads.calibration import Calibration  # noqa: F401
    from specheads.heads.checkpoint import HeadCheckpointError  # noqa: F401
    from specheads.heads.loading import heads_for_decoding, load_heads  # noqa: F401
    from specheads.registry import HEAD_TYPES, HeadType, head_type_of  # noqa: F401


__getattr__, __dir__ = lazy_exports("specheads.heads", _EXPORTS, globals())
