"""Tiny modules that test configs name as dotted paths (importable once ``tests/`` is on sys.path)."""
