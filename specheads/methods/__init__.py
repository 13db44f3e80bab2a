"""One folder per method with a trained drafter (``medusa``, ``eagle``, ``draft_lm``, ``dflash``), each behind one
entry of :mod:`specheads.registry`: its recipe section, heads module, drafter, training step and evaluation,
and its engine layouts."""
