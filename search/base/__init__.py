"""The vocabulary every layer of search/ shares: trial attributes, states, MLflow tags, objectives and
the paths of what a study reads. Imports nothing else of search/."""
