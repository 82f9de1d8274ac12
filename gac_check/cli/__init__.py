"""The ``gac-check`` command: :mod:`.main` parses and dispatches, one module per job."""
