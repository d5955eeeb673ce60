"""Tiny modules that test configs name as dotted paths (``tests/`` must be on sys.path)."""
