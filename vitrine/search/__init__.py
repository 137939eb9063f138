"""Vitrine search layer (see docs/design.md)."""
