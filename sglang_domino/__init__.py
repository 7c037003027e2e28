"""Domino speculative decoding."""
