"""MLflow tracking of a study: the tracker, its stores and retries, parameters, the model registry."""
