"""cramnas: views over search results."""
