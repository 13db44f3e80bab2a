"""EAGLE-1/3 heads: recipe section, head, drafter (static trees and EAGLE-2 dynamic trees, whose tree family is
``trees.py``), training step."""
