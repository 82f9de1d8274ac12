"""Rank re-selection under the same budget: the exact knapsack, the factors, calibration."""
