"""Deployment targets: will a model load on a serving engine, which kernel runs each site,
and what padding makes it fast (docs/targets.md)."""
