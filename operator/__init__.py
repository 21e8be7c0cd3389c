"""goodput.operator."""
