"""``gac-check init``: write the CI workflow that gates a compressor's checkpoints where the
team deploys them (issue 41: green must mean "loads, and runs fast, on our engines").

The workflow is one template, ``gac_check/data/alignment-gate.yml.in``; docs/examples/
alignment-gate.yml is exactly what ``gac-check init`` writes for the values its first comment
names (tests/test_init.py holds them equal), and tests/test_gate_fresh_repo.py runs that file
in a fresh repository. The GPU, dtype and targets are read, spelled and checked as ``gac-check
MODEL`` reads them (``--gpu``, ``--dtype``, ``--target``); ``--tp`` and ``--quant`` fill in
a ``--target`` that names an engine alone. A value neither given nor answered is asked for
where stdin is a terminal, and is a usage error (one line, exit 2) where it is not: a gate
that guessed where the team deploys would not judge the deployment.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from importlib.resources import files
from pathlib import Path

from gac_check.contract.dtype_choice import DTYPES, dtype_name
from gac_check.errors import BadInput
from gac_check.plugin.options import add_gpu_option, add_target_option
from gac_check.profiles import GPU_PROFILES

#: Where GitHub Actions reads a workflow, from the repository's root.
WORKFLOW = Path(".github") / "workflows" / "alignment-gate.yml"
#: The deployment gate's --fail-on: a target that refuses the model, or also a slower kernel.
GATES = ("fallback", "refused")
DEFAULT_DTYPE = "float16"
#: What a spec may hold once written into a shell line of the workflow (no quoting needed).
SPEC_CHARS = re.compile(r"[A-Za-z0-9_.,=@+-]+")
ENGINES = "vllm, sglang, tensorrt-llm, llama.cpp"


def build_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = parser_class(prog="gac-check init",
                     description="Write .github/workflows/alignment-gate.yml into the current "
                     "repository: the CI workflow that gates the checkpoint your compressor "
                     "builds on the GPU, dtype and targets you deploy on (docs/plugin-and-ci.md"
                     "). Asks for what the options leave out when run in a terminal.")
    add_gpu_option(p.add_argument, "--gpu", default=None, dest="gpu")
    p.add_argument("--dtype", default=None, metavar="DTYPE",
                   help=f"the dtype you serve in: {', '.join(DTYPES)} or a short name such as "
                   f"fp16 (default {DEFAULT_DTYPE})")
    add_target_option(p.add_argument, "--target", dest="targets")
    p.add_argument("--tp", type=int, default=None, metavar="N",
                   help="tensor-parallel size, for each --target that names no tp=")
    p.add_argument("--quant", default=None, metavar="Q",
                   help="quantization (awq, fp8, Q4_K_M, ...), for each --target that names "
                   "no quant=")
    p.add_argument("--fail-on", choices=GATES, default="fallback",
                   help="the deployment gate: fallback (default) fails on a target that "
                   "refuses the model or runs a layer on a slower kernel; refused on loading "
                   "alone")
    p.add_argument("--force", action="store_true", help="replace an existing workflow file")
    return p


def main(argv: Sequence[str], parser_class: type[argparse.ArgumentParser]) -> int:
    args = build_parser(parser_class).parse_args(argv)
    path = _root(Path.cwd()) / WORKFLOW
    if path.exists() and not args.force:  # before any question: nothing to answer for
        raise BadInput("exists; pass --force to replace it", path)
    ask = _asker() if sys.stdin.isatty() else None
    gpu = _gpu(args.gpu or _needed(ask, "the GPU you serve on", ", ".join(GPU_PROFILES),
                                   "--gpu"))
    dtype = _dtype(args.dtype or (ask and ask("the dtype you serve in", ", ".join(DTYPES),
                                              DEFAULT_DTYPE)) or DEFAULT_DTYPE)
    specs = args.targets or [_asked_target(ask)]
    targets = [_target(s, args.tp, args.quant) for s in specs]
    text = render(gpu, dtype, targets, args.fail_on)
    from gac_check.checkpoint.atomic import write_atomic

    try:
        write_atomic(path, text, replace=args.force)
    except FileExistsError:  # written by someone else since the check above
        raise BadInput("exists; pass --force to replace it", path) from None
    print(f"wrote {path}\n  structure gate: --gpu {gpu} --dtype {dtype}\n  deployment gate: "
          f"{' '.join(f'--target {t}' for t in targets)} --fail-on {args.fail_on}\n  next: "
          "set the repository variable GAC_CHECK, add the .gitignore lines "
          "(docs/plugin-and-ci.md, \"Adopting the gate\")")
    return 0


def render(gpu: str, dtype: str, targets: list[str], fail_on: str) -> str:
    """The workflow for these values, with the command that writes it in its first comment."""
    command = " ".join([f"--gpu {gpu} --dtype {dtype}", *(f"--target {t}" for t in targets),
                        f"--fail-on {fail_on}"])
    text = files("gac_check").joinpath("data/alignment-gate.yml.in").read_text("utf-8")
    for key, value in (("COMMAND", command), ("GPU", gpu), ("DTYPE", dtype),
                       ("TARGETS", " ".join(f"--target {t}" for t in targets)),
                       ("FAIL_ON", fail_on)):
        text = text.replace(f"@{key}@", value)
    return text


def _root(cwd: Path) -> Path:
    """The repository the workflow belongs to: the nearest directory with ``.git`` (a folder,
    or a worktree's file), else the current one."""
    return next((d for d in (cwd, *cwd.parents) if (d / ".git").exists()), cwd)


def _gpu(value: str) -> str:
    value = value.strip().lower()
    if value not in GPU_PROFILES:
        raise BadInput(f"--gpu {value!r}: the workflow's GPU jobs need the GPU you serve on, "
                       f"one of {', '.join(GPU_PROFILES)}")
    return value


def _dtype(value: str) -> str:
    return dtype_name(value.strip())


def _target(spec: str, tp: int | None, quant: str | None) -> str:
    """``spec`` with ``--tp`` and ``--quant`` added where it names neither, checked as
    ``gac-check MODEL --target`` checks it (an unknown engine or option: one line, exit 2)."""
    from gac_check.targets.spec import parse_target  # the rule packs: only when writing

    spec = "".join(spec.split())
    given = {p.partition("=")[0].lower() for p in spec.split(",")[1:]}
    if tp is not None and "tp" not in given:
        spec += f",tp={tp}"
    if quant and "quant" not in given:
        spec += f",quant={quant.strip()}"
    if not SPEC_CHARS.fullmatch(spec):
        raise BadInput(f"--target {spec!r}: only letters, digits and . , = @ + - _ belong in "
                       "a target")
    parse_target(spec)
    return spec


def _asked_target(ask: Callable[..., str] | None) -> str:
    """One target from three answers: the engine, its TP size and its quantization."""
    engine = _needed(ask, "the engine you deploy on", ENGINES, "--target")
    tp = ask("its tensor-parallel size", "1, 2, 4, 8", "1")  # type: ignore[misc]
    quant = ask("its quantization", "none, awq, gptq, fp8, Q4_K_M, ...", "")  # type: ignore[misc]
    return engine + ("" if tp == "1" else f",tp={tp}") + (f",quant={quant}" if quant else "")


def _needed(ask: Callable[..., str] | None, what: str, choices: str, option: str) -> str:
    if ask is None:
        raise BadInput(f"name {what}: {option} (or run gac-check init in a terminal to be "
                       "asked)")
    answer = ask(what, choices, "")
    if not answer:
        raise BadInput(f"no answer for {what} ({option})")
    return answer


def _asker() -> Callable[[str, str, str], str]:
    """A question on stderr, the answer read from the terminal (the default where empty)."""
    def ask(what: str, choices: str, default: str) -> str:
        shown = f" [{default}]" if default else ""
        sys.stderr.write(f"{what} ({choices}){shown}: ")
        sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            raise BadInput(f"no answer for {what}: stdin closed")
        return line.strip() or default
    return ask


__all__ = ["WORKFLOW", "main", "render"]
