"""Settings every unit test shares.

Hypothesis's per-example deadline (200 ms by default) is a timing assertion, and timing is measured
by the scripts in bench/, not by tests: on a loaded machine (the e2e clusters beside the unit
tests, a CI runner shared with others) it failed examples whose behaviour was right. Property tests
still bound their work with `max_examples`, and pytest-timeout bounds a test that hangs.
"""

from hypothesis import settings

settings.register_profile("goodput", deadline=None)
settings.load_profile("goodput")
