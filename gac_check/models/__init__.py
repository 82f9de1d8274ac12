"""Runnable models: low-rank modules, loaders for every layout, the reference compressor.

torch is imported at module level here: nothing on the check path imports this package.
"""
