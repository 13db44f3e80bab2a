"""EAGLE-1/3 heads: recipe section, head, drafter (static and EAGLE-2 dynamic trees), training step."""
