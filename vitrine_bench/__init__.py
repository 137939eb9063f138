"""Vitrine benchmarks: kept outside the library; run them with `vitrine bench`."""
