"""goodput.estimators."""
