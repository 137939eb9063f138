"""Vitrine encoders layer (see docs/design.md)."""
