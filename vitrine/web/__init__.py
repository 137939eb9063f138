"""Vitrine web layer (see DESIGN.md)."""
