"""cramnas: the architecture search loop."""
