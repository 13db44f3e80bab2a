"""Argument types and choices shared by the command line (:mod:`specheads.cli`) and the training entry point
(:mod:`specheads.train`), kept apart so that neither imports the other."""

from __future__ import annotations

import argparse

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (0 or a negative count is an error, never silently something else)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value
