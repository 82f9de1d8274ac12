"""The public Python API (docs/api.md): check a model, repair it, realign it.

``gac_check.check``, ``gac_check.repair`` and ``gac_check.realign`` are these functions; the
CLI, the pytest plugin and :mod:`gac_check.testing` call them and render what they return.
"""
from gac_check.analysis import CheckResult
from gac_check.api.flows import FixResult, check, realign, repair

__all__ = ["CheckResult", "FixResult", "check", "realign", "repair"]
