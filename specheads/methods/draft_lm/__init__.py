"""A draft model distilled from the base: recipe section, model, training step."""
