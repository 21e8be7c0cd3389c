"""goodput.cluster."""
