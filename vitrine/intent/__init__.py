"""Vitrine intent layer (see docs/design.md)."""
