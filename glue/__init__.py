"""cramnas: GLUE transfer of crammed checkpoints."""
