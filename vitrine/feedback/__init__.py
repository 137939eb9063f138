"""Shopper feedback: search logging and event intake, the event log and its stores, clicks as evidence, learning from the log, analytics (docs/learning.md, docs/analytics.md)."""
