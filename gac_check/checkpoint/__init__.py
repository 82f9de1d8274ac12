"""Reading checkpoints (headers only, never unpickling) and writing outputs all-or-nothing."""
