"""The Shape Contract: published rules, rules measured from a stored sweep, and the choice."""
