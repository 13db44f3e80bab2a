"""Draft heads (Medusa, EAGLE): arriving with issue 4 and later."""
