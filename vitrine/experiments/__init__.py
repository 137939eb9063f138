"""A/B experiments on ranking: variants, assignment, rollout and the verdict (docs/experiments.md)."""
