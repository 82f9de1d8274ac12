"""The exit-code contract (docs/design.md, "Exit codes"), in one place for every job.

0: nothing at or above ``--fail-on``; 1: findings at or above it; 2: bad input or usage (one
line on stderr, nothing written); 3: an internal error, so a crash is never read as findings.
"""
from __future__ import annotations

EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


#: ``--fail-on`` values that gate on the deployment targets' verdicts alone
TARGET_GATES = {"refused": ("refused",), "fallback": ("fallback", "refused")}


def exit_code(findings: list, fail_on: str) -> int:
    """The exit-code contract: 1 only for findings at or above ``--fail-on``; ``refused``
    fails only on a target that will not load a site, ``fallback`` also on a slower kernel."""
    if fail_on == "never":
        return EXIT_OK
    if fail_on in TARGET_GATES:
        gate = TARGET_GATES[fail_on]
        hit = any(r.verdict in gate for f in findings for r in f.rules)
        return EXIT_FINDINGS if hit else EXIT_OK
    levels = ("error",) if fail_on == "error" else ("error", "warning")
    return EXIT_FINDINGS if any(f.severity in levels for f in findings) else EXIT_OK
