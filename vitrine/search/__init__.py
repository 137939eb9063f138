"""Vitrine search layer (see DESIGN.md)."""
