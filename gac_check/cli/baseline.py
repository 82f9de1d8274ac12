"""``gac-check baseline record|published|contract``: make and read per-hardware baselines.

* ``record``: measure this device's baseline (the sweeps a measured contract is derived from,
  and the perf gate's reference kernel) into ``baselines/<key>.json``
  (:mod:`gac_check.bench.sweep` holds the plan and the recording);
* ``published``: write a GPU's published sweeps as a baseline (:mod:`gac_check.bench.published`);
* ``contract``: the measured contract a baseline gives, and its drift against the published
  rules or another baseline (:mod:`gac_check.contract.measured`).

Only parsing and printing live here; errors reach the one boundary in
:func:`gac_check.cli.main.guarded` (exit 2 or 3, one line).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from gac_check.bench import baselines, published, sweep
from gac_check.bench.device import measuring, present
from gac_check.contract import measured
from gac_check.contract.rules import cpu_rules, gpu_rules
from gac_check.errors import BadInput, HardwareMissing
from gac_check.profiles import CHOICES

RECORD_EXAMPLES = """examples:
  gac-check baseline record --gpu cpu            # -> baselines/cpu-<vendor>-<isa>.json
  gac-check baseline record --gpu h100           # on an H100 -> baselines/h100.json
  gac-check baseline record --dry-run            # what it would record here, how long
  gac-check baseline record --gpu cpu --smoke    # the whole path in seconds

The run starts no group after --max-seconds, keeps what it measured and names what it left
out (exit 1). An unlisted GPU records into baselines/gpu-<name>.json, the file the perf
tests on it read."""


def build_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = parser_class(prog="gac-check baseline",
                     description="Record, write or read the per-hardware baselines that perf "
                     "tests gate against and measured contracts are derived from "
                     "(docs/measuring.md).")
    sub = p.add_subparsers(dest="command", required=True, metavar="record|published|contract")
    _record_parser(sub)
    pub = sub.add_parser("published", help="write a GPU's published sweeps as a baseline",
                         description="Write a GPU's published sweeps (the tables packaged with "
                         "gac-check) as a baseline file.")
    pub.add_argument("gpu", choices=sorted(published.GPUS), metavar="GPU",
                     help=f"whose sweeps: {', '.join(sorted(published.GPUS))}")
    pub.add_argument("out", type=Path, metavar="OUT.json", help="the baseline file to write")
    pub.add_argument("--reference", type=Path, default=None, metavar="DIR",
                     help="directory with the published-<gpu>-*.tsv tables (default: the "
                     "copies packaged in gac_check/data)")
    con = sub.add_parser("contract", help="the measured contract a baseline gives, and drift",
                         description="Derive the measured contract (which moduli matter, and "
                         "by how much) from a baseline's sweeps and report its drift against "
                         "the published rules or another baseline.")
    con.add_argument("baseline", type=Path, metavar="BASELINE.json",
                     help="a recorded baseline (baselines/<key>.json)")
    con.add_argument("--dtype", default="float32", help="the sweeps' dtype (default float32)")
    con.add_argument("--against", default="published", metavar="published|OTHER.json",
                     help="what drift is judged against (default: the published rules)")
    con.add_argument("--include-published", action="store_true",
                     help="also derive from published cases (e.g. baselines/a100.json)")
    return p


def _record_parser(sub) -> None:
    rec = sub.add_parser("record", help="measure this device's baseline",
                         description="Measure this device's baseline in one command: the "
                         "sweeps a measured contract\nis derived from, and the reference "
                         "kernel the perf gate normalises by.", epilog=RECORD_EXAMPLES,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    rec.add_argument("--gpu", default="auto", type=str.lower, choices=CHOICES,
                     metavar="PROFILE", help="the device to measure on, which must be present: "
                     f"{', '.join(CHOICES)} (default auto: the GPU present, else the CPU)")
    rec.add_argument("--profile", dest="gpu", type=str.lower, choices=CHOICES,
                     help=argparse.SUPPRESS)  # its name before `gac-check baseline record`
    rec.add_argument("--out", type=Path, metavar="FILE.json",
                     help="baseline file (default baselines/<key>.json)")
    rec.add_argument("--dtype", default="float32",
                     help="CPU: the one dtype of this process (default float32)")
    rec.add_argument("--smoke", action="store_true",
                     help="three sizes per group, few samples: checks the whole path quickly")
    rec.add_argument("--dry-run", action="store_true",
                     help="print the plan and its estimated time; measure nothing")
    rec.add_argument("--max-seconds", type=float, default=sweep.MAX_SECONDS, metavar="SECONDS",
                     help="start no group after this many seconds (default %(default)s)")


def main(argv: Sequence[str], parser_class: type[argparse.ArgumentParser]) -> int:
    args = build_parser(parser_class).parse_args(argv)
    if args.command == "record":
        return record(args, list(argv[1:]))
    if args.command == "published":
        return write_published(args)
    return contract(args)


def record(args: argparse.Namespace, argv: list[str]) -> int:
    """Print the plan, then measure it on the device asked for (refused where absent; a dry
    run shows any device's plan)."""
    try:
        device = None if args.dry_run else measuring(args.gpu)
    except HardwareMissing as exc:
        raise BadInput(str(exc)) from None
    on_cpu = args.gpu == "cpu" or (args.gpu == "auto" and present().kind == "cpu")
    kind = device.kind if device else "cpu" if on_cpu else "cuda"
    plan = sweep.record_plan(kind, args.dtype)
    plan = plan.smoke() if args.smoke else plan
    for g in plan.groups:
        print(f"{g.name}: {len(g.works)} cases")
    print(f"{plan.cases} cases on {kind}, about {plan.estimate_s() / 60:.1f} min (estimate "
          "from assumed throughputs)")
    if device is None:
        return 0
    out = args.out or baselines.path_for(device.key)
    command = "gac-check baseline record " + shlex.join(argv)
    skipped = sweep.record(plan, device.kind, device.key, out, command, args.dtype,
                           args.max_seconds)
    if skipped:
        print(f"time was up after --max-seconds {args.max_seconds:.0f}: not recorded: "
              f"{', '.join(skipped)}", file=sys.stderr)
        return 1
    print(f"recorded {out}")
    return 0


def write_published(args: argparse.Namespace) -> int:
    try:
        base = published.published_baseline(args.gpu, args.reference)
    except ValueError as exc:  # a table whose numbers do not parse
        raise BadInput(f"not a published table ({exc})", args.reference) from None
    baselines.save(base, args.out)
    print(f"wrote {len(base.cases)} published cases to {args.out}")
    return 0


def contract(args: argparse.Namespace) -> int:
    base = baselines.load(args.baseline)
    only_measured = not args.include_published
    rules, seen = measured.derive_rules(base, args.dtype, only_measured)
    if args.against == "published":
        ref = cpu_rules(args.dtype) if base.profile.startswith("cpu") else gpu_rules(
            args.dtype, base.profile)
    else:
        ref = measured.derive_rules(baselines.load(Path(args.against)), args.dtype)[0]
    for fam in measured.families(base, args.dtype, only_measured):
        if fam.noise > measured.MAX_NOISE:
            print(f"{fam.label}: too noisy to judge (median relative IQR {fam.noise:.2f} > "
                  f"{measured.MAX_NOISE}); re-run the sweep on a quiet machine")
    for e in seen:
        flag = "MATTERS" if e.matters else "-"
        print(f"{e.family}: mod {e.modulus:>2}: rescue {e.rescue:.3f}x over {e.pairs} pairs "
              f"({e.significant} significant) {flag}")
    for r in rules:
        print(f"rule {r.id} [{r.severity}]: {r.why}")
    print("\n".join(measured.drift(ref, rules, measured.roles_covered(seen)).lines()))
    return 0
