"""Vitrine index layer (see DESIGN.md)."""
