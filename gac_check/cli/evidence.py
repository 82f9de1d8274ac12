"""``gac-check evidence``: a lent GPU's minutes turned into baselines, perf-suite results,
end-to-end latencies and measured slowdowns, in one command (:mod:`gac_check.evidence`).

Before anything is imported that needs more than the GPU machine's own packages, the command
checks that every module the run imports is there, and names what is missing in one line
(exit 2): that machine has no network, so a missing wheel must be carried (docs/measuring.md).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

from gac_check.cli.exits import EXIT_FINDINGS, EXIT_OK
from gac_check.errors import BadInput, HardwareMissing
from gac_check.profiles import CHOICES

#: the evidence run's stages in their order (gac_check.evidence.budget.SHARES, not imported
#: here: the package check below comes before any import of torch)
STAGES = ("baseline", "suites", "latency", "slowpaths", "report")

#: Every third-party module the evidence run imports (gac-check's own imports and the perf
#: suites' pytest run). tqdm and numpy come with transformers; httpx2 is imported only for Hub
#: models, which the run never reads.
NEEDS = ("torch", "transformers", "safetensors", "jinja2", "tqdm", "numpy", "pytest",
         "hypothesis")
EXAMPLES = """examples:
  gac-check evidence --gpu auto --minutes 8 --out evidence-h100   # on a GPU machine
  gac-check evidence --smoke --out /tmp/ev                        # any machine, seconds
  gac-check evidence --stages latency,report --minutes 5 --out ev   # a second, shorter call

OUT gets seven files: <key>.json (the baseline), results.json, results.md, junit.xml,
report.html, report.json and evidence.log. docs/measuring.md says how to commit them."""


def build_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = parser_class(prog="gac-check evidence", epilog=EXAMPLES,
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     description="On a GPU, within --minutes: record the device's baseline, "
                     "run the perf suites against it, time a Llama-3-8B-shaped model dense, "
                     "compressed, repaired and realigned, and time each slow path against its "
                     "aligned neighbour; each stage stops itself at its budget.")
    p.add_argument("--gpu", default="auto", type=str.lower, choices=CHOICES, metavar="PROFILE",
                   help="the GPU to measure, which must be present (default auto: the one "
                   "present)")
    p.add_argument("--minutes", type=float, default=8.0,
                   help="the whole run's budget (default 8), shared by the stages")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="where the files go (created; must be empty if it exists)")
    p.add_argument("--stages", type=_stages, default=STAGES, metavar="A,B",
                   help=f"only these stages, sharing --minutes in their usual proportions "
                   f"(default all: {','.join(STAGES)}); report needs latency's forms")
    p.add_argument("--smoke", action="store_true",
                   help="the same stages at tiny sizes, on a CPU too: checks the path")
    return p


def main(argv: Sequence[str], parser_class: type[argparse.ArgumentParser]) -> int:
    args = build_parser(parser_class).parse_args(argv)
    if not 0 < args.minutes <= 60:
        raise BadInput(f"--minutes must be between 0 and 60, not {args.minutes}")
    missing = [m for m in NEEDS if find_spec(m) is None]
    if missing:
        raise BadInput(f"evidence needs Python packages missing here: {', '.join(missing)}; "
                       "carry them as wheels (docs/measuring.md, \"Carrying wheels\")")
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise BadInput("exists and is not an empty directory; name a new one", args.out)
    device = _device(args)
    from gac_check.evidence.run import Request, run, summary_lines

    command = "gac-check evidence " + shlex.join(argv)
    doc = run(Request(device, args.out, args.minutes, args.smoke, command, args.stages))
    for line in summary_lines(doc):
        print(line)
    print(f"wrote {', '.join(doc['files'])} to {args.out}", file=sys.stderr)
    whole = all(s["status"] == "complete" for s in doc["stages"].values()) and not any(
        isinstance(doc.get(n), dict) and "error" in doc[n] for n in doc["stages"])
    return EXIT_OK if whole else EXIT_FINDINGS  # like baseline record: what ran is saved


def _stages(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in STAGES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"stages are {', '.join(STAGES)}, not {text!r}")
    if "report" in names and "latency" not in names:
        raise argparse.ArgumentTypeError("report checks the forms latency makes: name both")
    return tuple(n for n in STAGES if n in names)


def _device(args: argparse.Namespace):
    """The device measured on: a GPU, or the CPU under --smoke only."""
    from gac_check.bench.device import measuring

    if args.smoke:
        return measuring("cpu" if args.gpu == "auto" and not _has_cuda() else args.gpu)
    if args.gpu == "cpu" or not _has_cuda():
        raise BadInput("evidence measures a GPU and this machine has no CUDA device; "
                       "--smoke runs the same stages at tiny sizes here")
    try:
        return measuring(args.gpu)
    except HardwareMissing as exc:
        raise BadInput(str(exc)) from None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
