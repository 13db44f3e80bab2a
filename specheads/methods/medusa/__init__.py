"""Medusa-1/2 heads: recipe section, heads, drafter, training step, held-out evaluation."""
