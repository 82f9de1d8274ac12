"""Makes the in-repo plugin active for `pytest suites/` and `pytest tests/` even when the package
is not installed (when it is, the pytest11 entry point already loads it)."""
from importlib.metadata import entry_points

if not any(ep.value == "gac_check.plugin.hooks" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["gac_check.plugin.hooks"]
