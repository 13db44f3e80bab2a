"""Block-parallel drafters, DFlash and DSpark: heads, their recipe section, training step, drafter (chains and
DDTree trees) and engine layouts."""
