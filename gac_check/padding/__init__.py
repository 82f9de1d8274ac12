"""Exact zero-padding repair: a pure planner (plan.py) and a streaming writer (write.py)."""
