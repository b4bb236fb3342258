"""Reliability tests: faults injected into real tiny studies (both stores checked after each), bad input, safe defaults."""
