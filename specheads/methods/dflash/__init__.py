"""Block-parallel drafters, DFlash and DSpark: heads, their recipe section, training step, drafter (chains and
DDTree trees, whose tree family is ``trees.py``) and engine layouts."""
