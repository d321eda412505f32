"""Capability: repeated measurements and their spread (checks on the repeats, the report's spread section)."""
