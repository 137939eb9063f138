"""Merchandising: a shop's rules over the ranking (pins, boosts, hides, banners, campaigns), partial product updates (patch), and their store (docs/merchandising.md)."""
