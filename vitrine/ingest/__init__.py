"""Vitrine ingest layer (see docs/design.md)."""
