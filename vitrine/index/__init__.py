"""Vitrine index layer (see docs/design.md)."""
