"""``gac-check evidence``: turn a briefly lent GPU into committed figures in one command.

A GPU is available now and then, for minutes, with no network: this package runs every
measurement gac-check publishes (the device's baseline, the perf suites, end-to-end latency of
a Llama-3-8B-shaped model in its compressed, repaired and realigned forms, the slow paths torch
reaches) within a time budget, each stage stopping itself, and writes at most eight files.
docs/measuring.md ("GPU evidence in one call") is the manual.
"""
