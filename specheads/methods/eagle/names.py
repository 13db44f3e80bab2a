"""The names of EAGLE's grown trees, importable without torch: the registry's default bench rows and the demo read
them from here, where the tree family (:mod:`specheads.methods.eagle.trees`, which imports torch) reads them too."""

from __future__ import annotations

KIND = "dynamic"  # EAGLE-2's dynamic tree: the tree= name, and the field of the calibration record

# The trees ``specheads bench`` decodes EAGLE heads with by default (rows ``eagle-<tree>``).
BENCH_TREES = ("chain-3", "chain-5", "binary-7", KIND, f"{KIND}-4-5-16", "auto")
