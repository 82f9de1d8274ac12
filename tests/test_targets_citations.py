"""Every citation in the rule packs resolves: the cited file exists at the cited release and
defines the cited function (issue 28 item 5), read from the engines' released artifacts that
``make engine-sources`` caches (tests/engine_sources.py). Refs are releases or commits, never
a branch that moves."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from engine_sources import (
    MEMBERS,
    NOT_IN_A_REGISTRY,
    Citation,
    citations,
    needed,
    release,
    stale,
)

from gac_check.targets.packs import packs

BRANCHES = {"main", "master", "HEAD", "dev", "nightly"}
RELEASE = re.compile(r"^v?\d+\.\d+(\.\d+)?([.-]?(post|rc|dev)\d+)?$")
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
#: a pack whose versions no release could be read for (docs/targets.md says why)
UNRELEASED = {"tensorrt-llm"}


def test_refs_are_releases_or_commits_never_a_branch():
    bad = [f"{c.where}: {c.repo}@{c.ref}" for c in citations()
           if c.ref in BRANCHES or not (RELEASE.match(c.ref) or COMMIT.match(c.ref)
                                         or re.match(r"^b\d+$", c.ref))]
    assert not bad, "\n".join(bad)


def test_pack_versions_are_releases():
    for pack in packs().values():
        if pack.engine in UNRELEASED:
            assert pack.versions == ("main",) and any("No release could be read" in n
                                                      for n in pack.notes)
            continue
        for v in pack.versions:
            assert RELEASE.match(v) or COMMIT.match(v) or re.match(r"^b\d+$", v), (pack.engine, v)


def test_every_citation_has_a_registry_artifact_or_says_why_not():
    for c in citations():
        if release(c.repo, c.ref) is None:
            assert c.repo in NOT_IN_A_REGISTRY or f"{c.repo}@{c.ref}" in NOT_IN_A_REGISTRY, c


def _identifiers(function: str) -> list[list[str]]:
    """The names a function citation states before any parenthesised remark:
    ``A.b / C; D`` -> [[A, b], [C], [D]]; ``x::y`` and ``t[].f`` split the same way."""
    head = function.split(" (", 1)[0]
    out = []
    for token in re.split(r"\s*(?:/|;|,| -> )\s*", head):
        parts = [p for p in re.split(r"\.|::|\[\]", token.strip()) if p]
        if parts and all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) for p in parts):
            out.append(parts)
    return out


def _defines(text: str, name: str, python: bool) -> bool:
    if not python:
        return re.search(rf"\b{re.escape(name)}\b", text) is not None
    return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b"
                     rf"|^\s*{re.escape(name)}\s*(?::[^=\n]*)?=", text, re.M) is not None


def problem(c: Citation, root: Path) -> str | None:
    """Why ``c`` does not resolve in the release cached at ``root`` (None: it does)."""
    path = root / c.file
    if not path.is_file():
        return f"{c.where}: {c.file} is not in {c.repo}@{c.ref}"
    text = path.read_text(errors="replace")
    names = _identifiers(c.function)
    if not names:
        return f"{c.where}: no function named in {c.function!r}"
    python = c.file.endswith(".py")
    for parts in names:
        missing = [p for p in parts if not _defines(text, p, python)]
        if missing:
            return (f"{c.where}: {'.'.join(parts)} is not defined in {c.file} at {c.ref} "
                    f"(missing {', '.join(missing)})")
    return None


@pytest.mark.slow
def test_every_cited_file_and_function_exists_at_its_ref():
    absent = sorted(r.requirement for r, files in needed().items() if stale(r, files))
    if absent:
        message = (f"engine sources not cached ({', '.join(absent)}): run `make "
                   "engine-sources` (CI does, before the slow tier)")
        if os.environ.get("GAC_REQUIRE_ENGINE_SOURCES"):
            pytest.fail(message)
        pytest.skip(message)
    problems = []
    checked = 0
    for c in citations():
        rel = release(c.repo, c.ref)
        if rel is None:
            continue
        assert (rel.dir / MEMBERS).is_file()
        checked += 1
        if (why := problem(c, rel.dir)) is not None:
            problems.append(why)
    assert checked > 100
    assert not problems, "\n".join(sorted(set(problems)))


def test_identifiers_of_a_citation():
    assert _identifiers("FlashAttentionBackend.supports_head_size (order: x.py f)") == [
        ["FlashAttentionBackend", "supports_head_size"]]
    assert _identifiers("LlamaMLP / LlamaDecoderLayer.__init__") == [
        ["LlamaMLP"], ["LlamaDecoderLayer", "__init__"]]
    assert _identifiers("type_traits[].blck_size") == [["type_traits", "blck_size"]]
    assert _identifiers("llama_model::load_hparams (ml.get_key_or_arr(...))") == [
        ["llama_model", "load_hparams"]]


def test_a_citation_that_does_not_exist_is_caught(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "a.py").write_text("class K:\n    def can_implement(cls):\n        pass\n"
                                            "LIMIT = 3\n")
    ok = Citation("r", "vllm/a.py", "K.can_implement", "v1", "here")
    assert problem(ok, tmp_path) is None
    assert problem(Citation("r", "vllm/a.py", "LIMIT", "v1", "here"), tmp_path) is None
    assert "not defined" in problem(Citation("r", "vllm/a.py", "K.apply", "v1", "here"),
                                    tmp_path)
    assert "is not in" in problem(Citation("r", "vllm/b.py", "K", "v1", "here"), tmp_path)
