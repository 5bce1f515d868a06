"""A run's life cycle: suites, plans, variants, the launcher, the harness and its guard."""
