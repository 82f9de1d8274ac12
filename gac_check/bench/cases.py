"""Canonical case keys: the identity of a measurement in a baseline file.

``sdpa/B=4,S=2048,H=32,D=107,dtype=float16,backend=flash``: the kind, then its parameters in
the order the workload defines them. The key is text so a baseline file stays readable and a
diff of two files shows which cases changed; parsing it back gives the workload again.
"""
from __future__ import annotations

from functools import lru_cache

from gac_check.errors import BadInput


def case_key(kind: str, params: dict[str, object]) -> str:
    for name, value in params.items():
        text = str(value)
        if any(c in text for c in ",=/") or any(c in name for c in ",=/"):
            raise ValueError(f"case parameter {name}={text!r} would make an ambiguous key")
    return f"{kind}/" + ",".join(f"{k}={v}" for k, v in params.items())


def parse_case_key(key: str) -> tuple[str, dict[str, str]]:
    kind, params = _parsed(key)
    return kind, dict(params)


@lru_cache(maxsize=8192)
def _parsed(key: str) -> tuple[str, dict[str, str]]:
    """Memoised: a check reads the same published keys several times (a copy is returned)."""
    kind, sep, rest = key.partition("/")
    if not sep or not kind:
        raise BadInput(f"malformed case key {key!r} (expected kind/k=v,...)")
    params: dict[str, str] = {}
    for part in rest.split(",") if rest else []:
        name, eq, value = part.partition("=")
        if not eq or not name:
            raise BadInput(f"malformed case key {key!r}: {part!r} is not k=v")
        params[name] = value
    return kind, params
