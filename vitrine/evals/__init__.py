"""Vitrine evals layer (see DESIGN.md)."""
