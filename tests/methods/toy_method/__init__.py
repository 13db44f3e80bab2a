"""A toy method defined outside specheads, to prove that a new method is a folder and a registry entry.

One residual layer drafts a chain from the base's last hidden state: ``h_d = h_{d-1} + silu(W h_{d-1} + b)``, draft
depth d's token the base's lm_head on ``h_d`` (Medusa's alignment: at position t, depth d drafts token t + 1 + d).
The folder imports from specheads only the method API (:mod:`specheads.methods.api` and its phase modules) and, here,
the registry's :class:`~specheads.registry.HeadType` for its entry (its own modules relatively, so that it works
under any package name). Importing it registers nothing: whoever uses it calls
``specheads.registry.register(toy_method.ENTRY)``, as the conformance suite does before running every check on it
(``tests/methods/test_conformance.py``).
"""

from __future__ import annotations

from specheads.registry import HeadType

ENTRY = HeadType(
    name="toy",
    module=f"{__name__}.heads:ToyHeads",
    recipe=f"{__name__}.config:ToyHeadsConfig",
    build=f"{__name__}.train:build_heads",
    train_step=f"{__name__}.train:train_step",
    evaluate=f"{__name__}.train:evaluate",
    drafter=f"{__name__}.drafter:ToyDrafter",
    bench_trees=("chain-2", "chain-3"),
    formats=("toy", "toy-file"),
    layouts=("toy",),
    exports=f"{__name__}.export:FORMATS",
    draft_cost=f"{__name__}.drafter:draft_cost",
    calibratable=False,  # it drafts chains only, and calibration times branching trees
)
