"""Tiny modules the data-helper tests name by dotted path, like a user config would."""
