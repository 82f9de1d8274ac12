"""The pickle reader (never unpickling) and the torch zip around it, read and written."""
