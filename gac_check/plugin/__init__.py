"""The pytest plugin: hooks and fixtures (hooks.py, the pytest11 entry point), options,
the perf session, report collection and xdist workers."""
