"""goodput.testbed.cluster."""
