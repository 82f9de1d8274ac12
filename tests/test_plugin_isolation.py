"""Installing gac-check changes nothing for a project's tests that do not use it: hypothesis'
settings stay the project's own (even with $CI set), and no gac-check option is required."""
from __future__ import annotations

import os
import subprocess
import sys

PROJECT_TEST = '''
import os

from hypothesis import given, settings, strategies as st


def test_hypothesis_settings_are_the_projects_own():
    """hypothesis' defaults (with $CI set, hypothesis' own "ci" profile), never gac-check's
    (which run 25 examples)."""
    current = settings()
    assert current.max_examples == 100, current.max_examples
    if not os.environ.get("CI"):
        assert current.deadline is not None and not current.derandomize


@given(st.integers())
def test_a_property(x):
    assert isinstance(x, int)
'''


def test_plugin_leaves_other_projects_hypothesis_settings_alone(tmp_path):
    (tmp_path / "test_other.py").write_text(PROJECT_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS"))}
    for ci in ("", "true"):
        res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
                             cwd=tmp_path, env={**env, "CI": ci} if ci else env,
                             capture_output=True, text=True, check=False)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-1000:]
        assert "2 passed" in res.stdout
    listed = subprocess.run([sys.executable, "-m", "pytest", "--trace-config", "-q",
                             "--co"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            check=False)
    assert "gac_check.plugin.hooks" in listed.stdout  # the plugin was loaded all along
