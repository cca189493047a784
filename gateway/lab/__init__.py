"""Offline training, evaluation and plots (the complexity router, the semantic-cache verifier).

Nothing here serves requests: lab/ may import core, config and the serving siblings, and only
gateway/cli/ imports lab/ (tests/test_package_boundaries.py holds both rules)."""
