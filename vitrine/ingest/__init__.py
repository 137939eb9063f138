"""Vitrine ingest layer (see DESIGN.md)."""
