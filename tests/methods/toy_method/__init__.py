"""A toy method defined outside specheads, to prove that a new method is a folder and a registry entry.

One residual layer drafts a chain from the base's last hidden state: ``h_d = h_{d-1} + silu(W h_{d-1} + b)``, draft
depth d's token the base's lm_head on ``h_d`` (Medusa's alignment: at position t, depth d drafts token t + 1 + d).
The folder imports from specheads only :mod:`specheads.methods.api` (its own modules relatively, so that it works
under any package name); the conformance suite registers it with one :class:`~specheads.registry.HeadType` and runs
every check on it (``tests/methods/test_conformance.py``).
"""
