"""``python -m gac_check.cli``: the same as ``gac-check``."""
from gac_check.cli.main import main

raise SystemExit(main())
