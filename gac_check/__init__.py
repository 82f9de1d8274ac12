"""gac-check: find, repair and gate GPU-hostile dimensions in compressed LLM checkpoints.

``gac_check.check``, ``gac_check.repair`` and ``gac_check.realign`` (docs/api.md) are loaded
on first use: the pytest plugin imports this package in every pytest session of every user,
and a session that never checks a model must not pay for the checker's imports. The namespace
holds what docs/api.md documents and nothing else of its own (no ``annotations``, ``Any``).
"""
import typing as _typing

if _typing.TYPE_CHECKING:
    from gac_check.api import CheckResult, FixResult, check, realign, repair

__all__ = ["CheckResult", "FixResult", "check", "realign", "repair"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from gac_check import api

        return getattr(api, name)
    raise AttributeError(f"module 'gac_check' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
