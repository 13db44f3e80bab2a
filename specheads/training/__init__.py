"""Head training with Accelerate: arriving with issue 4."""
