"""The error of the training data layer, in a module of its own so that every reader module can raise it."""

from __future__ import annotations


class DataError(ValueError):
    """Training data that cannot be used: a missing path, a malformed file, an unusable chat template."""
