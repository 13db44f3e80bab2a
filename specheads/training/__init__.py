"""Head training with Accelerate: recipes, data, losses, the trainer, the feature cache and distillation."""
