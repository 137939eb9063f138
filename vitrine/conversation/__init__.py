"""Shopping sessions: a standing query refined turn by turn, follow-ups, and their store (docs/sessions.md)."""
