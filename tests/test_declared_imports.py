"""Every third-party import in gac_check is a distribution pyproject.toml declares.

A package that happens to be installed because something else needs it (httpx2 under
huggingface_hub, filelock under torch) works on the machine that wrote the import and breaks
for the user whose resolver picks another version of the thing in between, or none. The
imports are read with ``ast`` (every module, every nested import, every extra), mapped to
distributions through the installed metadata, and held to ``dependencies`` plus every
``optional-dependencies`` extra; the standard library is ``sys.stdlib_module_names``.
"""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gac_check"


def _normalise(name: str) -> str:
    """PEP 503's normal form: case and runs of ``-_.`` do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    """The distribution names of ``dependencies`` and of every extra (normalised)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    return {_normalise(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r.strip()).group(0))
            for r in reqs}


def third_party_imports(source: str) -> set[str]:
    """Top-level names of the absolute imports in ``source`` that are not the standard
    library or gac_check itself."""
    tops = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            tops.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return {t for t in tops if t != "gac_check" and t not in sys.stdlib_module_names}


def private_imports(source: str) -> set[str]:
    """Third-party modules imported through a private path (``torch._utils``,
    ``_pytest.nodes``): not the public API of the distribution, free to move in any release."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names
                         if alias.name.startswith("_"))
    return {n for n in names if n.split(".")[0] not in sys.stdlib_module_names
            and n.split(".")[0] != "gac_check" and any(p.startswith("_") for p in n.split("."))}


def undeclared(imports: set[str], declared: set[str]) -> set[str]:
    """The imports no declared distribution provides.

    An installed import name maps to its distributions through the installed metadata (httpx2
    is provided by ``httpx2``, ``xdist`` by ``pytest-xdist``); one not installed here (an
    extra such as flash-attn on a CPU machine) must at least be named like the distribution.
    """
    providers = importlib.metadata.packages_distributions()
    return {name for name in imports
            if not ({_normalise(d) for d in providers.get(name, ())} | {_normalise(name)})
            & declared}


def test_every_third_party_import_is_declared():
    declared = declared_distributions()
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in third_party_imports(path.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    missing = undeclared(set(found), declared)
    private = {str(path.relative_to(ROOT)): sorted(private_imports(path.read_text("utf-8")))
               for path in sorted(PACKAGE.rglob("*.py"))}
    assert not missing, {name: found[name] for name in sorted(missing)}
    assert {"torch", "transformers", "safetensors", "httpx2"} <= set(found)  # the scan sees
    assert not {path: names for path, names in private.items() if names}


def test_an_undeclared_import_is_caught():
    """The check itself: a dependency of a dependency (filelock, under torch and
    huggingface_hub) is installed here but declared nowhere."""
    imports = third_party_imports("import torch\n\ndef f():\n    from filelock import FileLock\n")
    assert imports == {"torch", "filelock"}
    assert undeclared(imports, declared_distributions()) == {"filelock"}


def test_a_private_import_is_caught():
    source = "from torch._utils import _rebuild_tensor_v2\nfrom torch.nn import Linear\n"
    assert private_imports(source) == {"torch._utils", "torch._utils._rebuild_tensor_v2"}
