"""Where in an engine's source a rule is: repository, file, function and released version.

Its own module because formats cite engines too (DeciLM's per-layer blocks,
:mod:`gac_check.targets.blocks`): a citation costs a check nothing, the rule packs it is
loaded with (:mod:`gac_check.targets.packs`) are read only where a target is judged.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    repo: str
    file: str
    function: str
    ref: str
    issue: str | None = None

    def __str__(self) -> str:
        return f"{self.repo}@{self.ref}:{self.file} ({self.function})"

    def as_dict(self) -> dict:
        d = {"repo": self.repo, "file": self.file, "function": self.function, "ref": self.ref}
        if self.issue:
            d["issue"] = self.issue
        return d
