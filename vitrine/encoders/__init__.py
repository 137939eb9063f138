"""Vitrine encoders layer (see DESIGN.md)."""
