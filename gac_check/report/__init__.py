"""Renderings of a check: text for terminals, JSON for machines, HTML for reviewers."""
