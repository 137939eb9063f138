"""Vitrine evals layer (see docs/design.md)."""
