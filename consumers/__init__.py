"""Stateless command workers: load state, decide, append atomically."""
