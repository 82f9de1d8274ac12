"""The exit-code contract (docs/design.md, "Exit codes"), in one place for every job.

0: nothing at or above ``--fail-on``; 1: findings at or above it; 2: bad input or usage (one
line on stderr, nothing written); 3: an internal error, so a crash is never read as findings.
"""
from __future__ import annotations

from gac_check.contract.rules import Finding, fails

EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def exit_code(findings: list[Finding], fail_on: str) -> int:
    """The exit-code contract: 1 only for findings at or above ``--fail-on``."""
    return EXIT_FINDINGS if fails(findings, fail_on) else EXIT_OK
