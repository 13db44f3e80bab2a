"""Everything a method folder may use from the rest of specheads: the three phase modules, re-exported as one.

A method (``specheads/methods/<name>/``) imports from specheads only the method API and its own folder; the registry
entry (:mod:`specheads.registry`) names the folder's parts. The structural test of the suite holds every method to
that, so these modules are the whole contract between the engine and a method. The API is split by phase, so that a
phase loads only what it needs:

- :mod:`specheads.methods.api_decode`: heads storage and the drafter's side of the engine (state, trees, sampling,
  the draft's cache). A method's heads module and drafter import only this one: loading heads and decoding import
  nothing from ``specheads.training`` or ``specheads.export`` (a test imports each drafter and checks).
- :mod:`specheads.methods.api_train`: recipe errors, the step's context and result, the teacher, losses, agreement.
- :mod:`specheads.methods.api_export`: the export-format record, writer and checker helpers, serve commands.

This module re-exports the three for a method's training and export code, which may use any phase's names: its
``__all__`` is theirs, so a new name goes into the phase module it belongs to and nowhere else.
"""

from __future__ import annotations

from specheads.methods import api_decode, api_export, api_train
from specheads.methods.api_decode import *  # noqa: F403
from specheads.methods.api_export import *  # noqa: F403
from specheads.methods.api_train import *  # noqa: F403

__all__ = [*api_decode.__all__, *api_train.__all__, *api_export.__all__]
