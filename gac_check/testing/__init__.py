"""Public helpers for testing compressors with gac-check: tiny stock transformers models
(models.py), hypothesis strategies (strategies.py) and the knapsack oracles and instance
strategies (knapsack.py; scipy comes with the test extra).
"""
