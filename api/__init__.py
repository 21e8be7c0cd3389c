"""goodput.api."""
