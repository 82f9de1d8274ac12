"""``python -m gac_check.demo [OUT]``: the old spelling of ``gac-check demo``, kept working."""
from __future__ import annotations

import sys

if __name__ == "__main__":  # runs that command
    import runpy  # the CLI is run as a program, not imported, as the other old spellings do

    sys.argv[1:1] = ["demo"]
    runpy.run_module("gac_check.cli", run_name="__main__")
