"""``python -m gac_check.demo [OUT]``: the old spelling of ``gac-check demo``, kept working."""
from __future__ import annotations

import sys

if __name__ == "__main__":
    from gac_check.cli.main import main

    raise SystemExit(main(["demo", *sys.argv[1:]]))
