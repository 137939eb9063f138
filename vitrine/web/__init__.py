"""Vitrine web layer (see docs/design.md)."""
