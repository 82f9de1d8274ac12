"""The repository's own pytest set-up (tests/ and suites/), not the plugin's.

Makes the in-repo plugin active even when the package is not installed (when it is, the
pytest11 entry point already loads it), enables pytester, and loads gac-check's hypothesis
profile for our own runs: ``ci`` (derandomized, no deadline) when ``$CI`` is set, else
``dev``. The plugin itself never touches hypothesis settings, so installing gac-check changes
no other project's tests. torch gets the threads this machine can use now
(:mod:`gac_check.threads`), not one per core, which a loaded runner's other processes hold.
"""
from importlib.metadata import entry_points

from gac_check.testing import settings as hypothesis_settings
from gac_check.threads import set_torch_threads

#: pytester: the plugin's tests run pytest in this process where a subprocess is not the
#: point (:func:`tests.helpers.pytest_here`)
pytest_plugins = ["pytester"]
if not any(ep.value == "gac_check.plugin.hooks" for ep in entry_points(group="pytest11")):
    pytest_plugins.append("gac_check.plugin.hooks")

hypothesis_settings.register_profiles()
hypothesis_settings.load_default_profile()
set_torch_threads()
