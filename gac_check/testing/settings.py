"""gac-check's hypothesis settings profiles, registered in one place.

``ci``: no deadline (shared runners stall) and derandomized (a red CI reproduces); ``dev``: no
deadline, random. Both print the ``@reproduce_failure`` blob so a report can quote it.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

CI, DEV = "ci", "dev"


def register_profiles() -> None:
    settings.register_profile(CI, deadline=None, derandomize=True, max_examples=25,
                              print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile(DEV, deadline=None, max_examples=25, print_blob=True)


def load_default_profile() -> None:
    """``$HYPOTHESIS_PROFILE``, else ``ci`` when ``$CI`` is set, else ``dev``."""
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", CI if os.environ.get("CI") else DEV))
