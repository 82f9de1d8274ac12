"""The engines' released source, fetched once from PyPI and cached, for the citation test.

Every rule in a pack cites a repository, a file, a function and a release
(docs/targets.md). The releases that a package registry holds are fetched with pip (no
dependencies, nothing installed): vLLM's and SGLang's release wheels and transformers' wheel
carry their Python source at the repository's paths (less SGLang's ``python/`` and
transformers' ``src/``), and llama-cpp-python's sdist vendors llama.cpp at the commit the pack
was read at. Only the cited files are kept, under ``.cache/engine-sources/<requirement>/``,
with the archive's file list beside them so that "not in this release" is told apart from
"not extracted yet". ``make engine-sources`` runs ``python tests/engine_sources.py`` (CI,
before the slow tier); the test skips, once and saying so, where the cache is absent.

What no registry holds (TensorRT-LLM's source, PyTorch's C++, llama.cpp tags that no
llama-cpp-python release vendors) is listed in ``NOT_IN_A_REGISTRY``, with why.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "engine-sources"
PACKS = ROOT / "gac_check" / "targets" / "packs"
MEMBERS = "_members.txt"
#: repositories (or repository@ref) whose cited source no package registry holds, and why
NOT_IN_A_REGISTRY = {
    "NVIDIA/TensorRT-LLM": "PyPI holds only a placeholder sdist (the wheels are on NVIDIA's "
                           "index); cited at commits read through the source index",
    "pytorch/pytorch": "the wheels carry no ATen C++ source",
    "ggml-org/llama.cpp@b4747": "no llama-cpp-python release vendors llama.cpp at this tag",
}


@dataclass(frozen=True)
class Citation:
    repo: str
    file: str
    function: str
    ref: str
    where: str  # the pack and rule that cite it


@dataclass(frozen=True)
class Release:
    """A registry artifact that holds a repository at a ref: ``member(file)`` is the cited
    file's name inside it."""

    requirement: str
    sdist: bool
    prefix: str = ""  # what the archive puts before the repository path
    strip: str = ""  # what the repository path has that the archive does not

    def member(self, file: str) -> str:
        return self.prefix + file.removeprefix(self.strip)

    @property
    def dir(self) -> Path:
        return CACHE / self.requirement


def release(repo: str, ref: str) -> Release | None:
    """The registry artifact of ``repo`` at ``ref``; None where no registry holds it."""
    version = ref.removeprefix("v")
    if repo == "vllm-project/vllm":
        return Release(f"vllm=={version}", sdist=False)
    if repo == "sgl-project/sglang":
        return Release(f"sglang=={version}", sdist=False, strip="python/")
    if repo == "huggingface/transformers":
        return Release(f"transformers=={version}", sdist=False, strip="src/")
    if repo == "ggml-org/llama.cpp" and ref == "0c1e57098":
        return Release("llama-cpp-python==0.3.36", sdist=True,
                       prefix="llama_cpp_python-0.3.36/vendor/llama.cpp/")
    return None


def citations() -> Iterator[Citation]:
    """Every source cited by every shipped pack (rules, otherwise, tp rules, GGUF extras)."""
    for path in sorted(PACKS.glob("*.json")):
        yield from _walk(json.loads(path.read_text()), path.name)


def _walk(node: object, where: str) -> Iterator[Citation]:
    if isinstance(node, dict):
        if {"repo", "file", "function", "ref"} <= set(node):
            yield Citation(node["repo"], node["file"], node["function"], node["ref"], where)
        name = node.get("id") or node.get("kernel")
        for value in node.values():
            yield from _walk(value, f"{where} {name}" if name else where)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value, where)


def _archive_names(path: Path) -> list[str]:
    if path.suffix == ".whl" or path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    with tarfile.open(path) as t:
        return t.getnames()


def _read(path: Path, member: str) -> bytes:
    if path.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(path) as z:
            return z.read(member)
    with tarfile.open(path) as t:
        f = t.extractfile(member)
        assert f is not None, member
        return f.read()


def fetch(rel: Release, files: set[str]) -> None:
    """Download ``rel`` (no dependencies), keep the cited ``files`` and the list of names."""
    with tempfile.TemporaryDirectory() as tmp:
        kind = ["--no-binary", ":all:"] if rel.sdist else ["--only-binary", ":all:"]
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        *kind, "-d", tmp, rel.requirement], check=True, timeout=1800)
        (archive,) = Path(tmp).iterdir()
        names = set(_archive_names(archive))
        rel.dir.mkdir(parents=True, exist_ok=True)
        for file in files:
            if rel.member(file) in names:
                out = rel.dir / file
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(_read(archive, rel.member(file)))
        (rel.dir / MEMBERS).write_text("\n".join(sorted(names)) + "\n")


def needed() -> dict[Release, set[str]]:
    """Per release, the cited files (every one a registry holds)."""
    out: dict[Release, set[str]] = {}
    for c in citations():
        rel = release(c.repo, c.ref)
        if rel is not None:
            out.setdefault(rel, set()).add(c.file)
    return out


def stale(rel: Release, files: set[str]) -> bool:
    """Whether the cache lacks the release, or a cited file it holds but did not extract."""
    if not (rel.dir / MEMBERS).is_file():
        return True
    names = set((rel.dir / MEMBERS).read_text().split())
    return any(rel.member(f) in names and not (rel.dir / f).is_file() for f in files)


def main() -> None:
    for rel, files in sorted(needed().items(), key=lambda kv: kv[0].requirement):
        if stale(rel, files):
            print(f"engine-sources: {rel.requirement} ({len(files)} cited files)", flush=True)
            fetch(rel, files)


if __name__ == "__main__":
    main()
