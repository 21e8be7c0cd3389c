"""goodput.controllers."""
