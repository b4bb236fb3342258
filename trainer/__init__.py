"""cramnas trainer: build and cram one architecture. Knows nothing of Ray, Optuna or MLflow."""
