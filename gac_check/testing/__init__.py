"""Public helpers for testing compressors with gac-check: hypothesis strategies (strategies.py)
and the knapsack oracles and instance strategies (knapsack.py; scipy comes with the test extra).
"""
