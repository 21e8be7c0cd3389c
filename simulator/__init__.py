"""goodput.simulator."""
