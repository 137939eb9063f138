"""Vitrine: multimodal semantic search for e-commerce catalogues."""

__version__ = "0.1.0"
