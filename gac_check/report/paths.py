"""Paths as a command in a report shows them: relative to the working directory, never the
absolute path of the machine that ran the check.

A report is read on another machine (a CI artifact, a merged team report), so a copy-paste
command holding ``/home/runner/work/...`` would not run there and says more about the runner
than the reader needs. The CLI records each model's path as the working directory names it
(``model_path`` in the check document) when it writes a report; a document from before that
is shown relative to the working directory of the one rendering it, where the model lies there.
"""
from __future__ import annotations

import os
from pathlib import PurePosixPath


def shown(path: str, cwd: str | None = None) -> str:
    """``path`` relative to ``cwd`` (default: the working directory) when it lies under it;
    a Hub name or a path outside it as it is."""
    if "://" in path or not os.path.isabs(path):
        return path
    here = os.path.abspath(cwd or os.getcwd())
    try:
        inside = os.path.commonpath([here, os.path.abspath(path)]) == here
    except ValueError:  # another drive (Windows)
        return path
    if not inside:
        return path
    rel = os.path.relpath(path, here)
    return str(PurePosixPath(*rel.split(os.sep))) if rel != "." else "."


def model_path(check: dict) -> str:
    """How a command in the report names the check's model."""
    return check.get("model_path") or shown(check["model_dir"])
