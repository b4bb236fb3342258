"""Reading finished studies: run frames, statistics, ranking and the promotion ladder."""
