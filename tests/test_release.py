"""Release-ready packaging (issue 41): the version a release is tagged with is pyproject.toml's,
CHANGELOG.md has an entry for it, and the release workflow's tag check (run as Actions runs
it, under bash) builds only for the tag ``v<version>``."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(),
                    re.M).group(1)
RELEASE = ROOT / "docs" / "examples" / "release.yml"


def tag_step() -> str:
    (step,) = [s for s in yaml.safe_load(RELEASE.read_text())["jobs"]["dist"]["steps"]
               if s.get("name") == "The tag is the version"]
    return step["run"]


def run_tag_check(tag: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GITHUB_REF_NAME": tag}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                           tag_step()], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_the_release_builds_only_the_tag_of_the_version():
    assert run_tag_check(f"v{VERSION}").returncode == 0
    wrong = run_tag_check("v9.9.9")
    assert wrong.returncode == 1 and f"is not v{VERSION}" in wrong.stdout


def test_the_changelog_and_the_readme_name_the_version():
    assert f"## {VERSION}" in (ROOT / "CHANGELOG.md").read_text()
    assert f"pip install gac-check=={VERSION}" in (ROOT / "README.md").read_text()


def test_make_dist_builds_sdist_and_wheel_from_a_clean_build_dir():
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\ndist: ", 1)[1].split("\n\n", 1)[0]
    assert "rm -rf build dist" in recipe and "--sdist --wheel" in recipe
