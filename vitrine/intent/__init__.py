"""Vitrine intent layer (see DESIGN.md)."""
