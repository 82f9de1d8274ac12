"""The repository's own pytest set-up (tests/ and suites/), not the plugin's.

Makes the in-repo plugin active even when the package is not installed (when it is, the
pytest11 entry point already loads it), enables pytester, and loads gac-check's hypothesis
profile for our own runs: ``ci`` (derandomized, no deadline) when ``$CI`` is set, else
``dev``. The plugin itself never touches hypothesis settings, so installing gac-check changes
no other project's tests. torch gets the threads this machine can use now
(:mod:`gac_check.threads`), not one per core, which a loaded runner's other processes hold.
"""
import os
import tempfile
from importlib.metadata import entry_points

from gac_check.testing import settings as hypothesis_settings
from gac_check.threads import set_torch_threads

#: Variables of the Hugging Face libraries that a caller's environment may set and that would
#: change what the tests see: CI systems often export HF_HUB_OFFLINE=1 to forbid downloads,
#: which refused every test that serves a Hub from 127.0.0.1 as "offline". The suite sets up
#: its own world instead; the tests that serve a Hub set HF_ENDPOINT and HF_HOME themselves.
HF_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "HUGGING_FACE_")


def isolate_hugging_face_environment() -> None:
    """Clear the callers' Hugging Face settings before any library reads them (huggingface_hub
    reads its constants once, at import; xdist's workers inherit this environment). Requests
    that no test directs go to a closed local port (nothing reaches the real Hub), and the cache
    and any stored token live in a fresh directory, not the user's."""
    for name in [n for n in os.environ if n.startswith(HF_PREFIXES)]:
        del os.environ[name]
    os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="gac-check-tests-hf-home-")


isolate_hugging_face_environment()

#: pytester: the plugin's tests run pytest in this process where a subprocess is not the
#: point (:func:`tests.helpers.pytest_here`)
pytest_plugins = ["pytester"]
if not any(ep.value == "gac_check.plugin.hooks" for ep in entry_points(group="pytest11")):
    pytest_plugins.append("gac_check.plugin.hooks")

hypothesis_settings.register_profiles()
hypothesis_settings.load_default_profile()
set_torch_threads()
