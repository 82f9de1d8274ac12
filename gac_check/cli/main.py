"""``gac-check``: the command line, its options and its exit codes; one module per job.

Exit codes are a contract (docs/design.md, "Exit codes"; :mod:`gac_check.cli.exits`): bad
input is one line on stderr and exit 2, any other crash exit 3, never 1.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from pathlib import Path

from gac_check.cli.exits import EXIT_BAD_INPUT, EXIT_INTERNAL
from gac_check.contract.dtype_choice import DTYPES, dtype_name
from gac_check.contract.rules import FAIL_ON
from gac_check.errors import BadInput
from gac_check.plugin.options import add_gpu_option, add_target_option
from gac_check.profiles import resolve_profile
from gac_check.report.outputs import DEFAULT_REPORT

#: ``gac-check COMMAND ...``: each command is one module under gac_check/cli with
#: ``main(argv, parser_class)``. The first argument names it; anything else is a MODEL, so a
#: model directory that happens to be called like a command is written ``./report``.
COMMANDS = {"report": "gac_check.cli.report", "baseline": "gac_check.cli.baseline",
            "compress": "gac_check.cli.compress", "demo": "gac_check.cli.demo",
            "evidence": "gac_check.cli.evidence", "init": "gac_check.cli.init"}
USAGE = """%(prog)s MODEL [MODEL ...] [options]         check (--repair OUT, --realign OUT)
       %(prog)s report merge RUN.json ... -o FILE.html
       %(prog)s baseline record|published|contract ...
       %(prog)s compress SRC OUT [--ratio R]
       %(prog)s demo [OUT]
       %(prog)s evidence --out DIR [--minutes 8] [--smoke]
       %(prog)s init --gpu GPU --target SPEC [--dtype DTYPE] [--force]"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"gac-check: error: {message}\n")
        raise SystemExit(EXIT_BAD_INPUT)


class _Version(argparse.Action):
    """``--version``, its number read from package metadata only when asked for (importing
    importlib.metadata costs a plain check more than reading a 70B model's header)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        sys.stdout.write(f"{parser.prog} {_version()}\n")
        parser.exit()


def _version() -> str:
    """The installed distribution's version (what a bug report should quote)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gac-check")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def _dtype(text: str) -> str:
    """``--dtype``: one of DTYPES or an alias (fp16, bf16, ...), the spelling every front end
    takes, by its canonical name."""
    try:
        return dtype_name(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bytes(text: str) -> int:
    """``16M``, ``512K``, ``1G`` or a plain byte count."""
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    scale = units.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
        return value
    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gac-check", usage=USAGE, description="Find, repair and gate GPU-hostile "
                "dimensions in a compressed model checkpoint.",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="""commands (each with its own --help):
  report merge   merge saved runs (one per GPU) into one HTML report
  baseline       record this device's baseline (record), write a GPU's published one
                 (published), or derive the measured contract and its drift (contract)
  compress       the reference low-rank compressor (truncated SVD, ASVD's layout)
  demo           compress, check, repair and realign the bundled real MiniLM
  evidence       on a lent GPU, every measurement gac-check publishes, within --minutes
  init           write the CI workflow gating your checkpoints on your GPU and targets

A model directory named like a command is written ./NAME. Exit codes: 0 nothing at or above
--fail-on, 1 findings, 2 bad input or usage, 3 internal error. Manual: docs/ in the source
tree.""")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="model directory (config.json + weights), or a Hub model checked from "
                   "its headers alone: hf://ORG/NAME[@REVISION], or ORG/NAME where no such "
                   "directory exists; several models make one model-zoo report")
    p.add_argument("--models-from", type=Path, metavar="FILE",
                   help="also check the models named in FILE, one a line (# comments)")
    p.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="say what reading each model cost on stderr (bytes fetched, "
                   "requests and seconds for a Hub model)")
    add_gpu_option(p.add_argument, "--gpu", default="auto", dest="gpu")
    p.add_argument("--dtype", type=_dtype, default=None, metavar="DTYPE",
                   help=f"dtype the model will be served in: {', '.join(DTYPES)}, or a short "
                   "name such as fp16 or bf16, as --gac-dtype and the Python API take them "
                   "(default: config.json's dtype, else the weights')")
    add_target_option(p.add_argument, "--target", dest="targets")
    p.add_argument("--format", choices=("text", "json"), default="text", dest="output",
                   help="text: the site table for a person (default); json: one gac-check/1 "
                   "object on stdout for a program (no progress on stderr)")
    p.add_argument("--fail-on", choices=FAIL_ON, default="error",
                   help="exit 1 when a site is at or above this severity (default error: a "
                   "kernel refuses the shape or a large slowdown; warning: also sub-optimal "
                   "multiples; refused: only a --target that will not load a site; fallback: "
                   "also a --target that runs a site on a slower kernel; never: only report)")
    p.add_argument("--report", nargs="?", const=DEFAULT_REPORT, metavar="FILE.html",
                   help="write the HTML alignment report (and its run JSON beside it); "
                   "without FILE: reports/<model>-<profile>.html")
    p.add_argument("--junit", type=Path, metavar="FILE.xml",
                   help="write one JUnit testcase per site; gated sites fail")
    p.add_argument("--bench", action="store_true",
                   help="time the misaligned sites against their repaired sizes on the "
                   "device present and print the measured speedups")
    hub = p.add_argument_group("Hub models (hf://ORG/NAME): bounds per model "
                               "(docs/remote.md, docs/security.md)")
    hub.add_argument("--hub-timeout", type=_positive(float), metavar="SECONDS",
                     help="longest any one request may take, redirects and body included "
                     "(default: HF_HUB_ETAG_TIMEOUT for the listing, HF_HUB_DOWNLOAD_TIMEOUT "
                     "for file reads, each 10 unless set); a whole model 6 times that")
    hub.add_argument("--hub-max-bytes", type=_positive(_bytes), metavar="BYTES",
                     help="most bytes fetched per model: listing, JSON files and headers "
                     "(default 16M; K, M and G suffixes)")
    hub.add_argument("--hub-max-requests", type=_positive(int), metavar="N",
                     help="most HTTP requests per model, redirects and retries included "
                     "(default 256)")
    fix = p.add_argument_group("fixing")
    fix.add_argument("--strategy", choices=("minimal", "optimal"), default="minimal",
                     help="minimal: the required multiple; optimal: the fastest one "
                     "(for --repair and --realign)")
    fix.add_argument("--force", action="store_true", help="replace an existing OUT, or a "
                     "file beside --report FILE.html named FILE.json that is no earlier run's")
    fix.add_argument("--repair", type=Path, metavar="OUT",
                     help="write the exact zero-padded repair of the model to OUT")
    fix.add_argument("--uniform", action="store_true",
                     help="--repair: pad every layer's MLP to the widest, so an engine that "
                     "builds every layer from one width (vLLM, SGLang, llama.cpp) loads OUT")
    fix.add_argument("--realign", type=Path, metavar="OUT",
                     help="write a model with aligned ranks re-selected under the same "
                     "parameter budget (exact multi-choice knapsack)")
    fix.add_argument("--base", type=Path, metavar="DENSE_DIR",
                     help="the dense original, so --realign can choose any aligned rank and "
                     "measure each choice's output error (SVD-LLM, PaLU: measure only)")
    fix.add_argument("--calib", type=Path, metavar="TEXT_FILE",
                     help="--realign objective: activation-aware (ASVD scaling) from this "
                     "calibration text run through the --base model (SVD-LLM, PaLU: the "
                     "measurement's inputs only)")
    fix.add_argument("--budget", default="same", metavar="same|FLOAT",
                     help="--realign budget: the input's parameter count (same) or a "
                     "fraction of the dense matrices' parameters")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = COMMANDS.get(argv[0]) if argv else None
    if command:
        return guarded(lambda: import_module(command).main(argv[1:], _Parser))
    return guarded(lambda: run(build_parser().parse_args(argv)))


def guarded(job: Callable[[], int]) -> int:
    """The one error boundary every command goes through (check, repair, realign, and each of
    :data:`COMMANDS`).

    Bad input and a failing environment (a full disk, a read-only target, no memory) are one
    line and exit 2; anything else is a bug: one line and exit 3, never 1, which a CI gate
    reads as "findings". Usage errors leave through argparse's SystemExit(2) untouched.
    """
    try:
        return job()
    except BadInput as exc:
        return _fail(str(exc), EXIT_BAD_INPUT)
    except BrokenPipeError:  # `gac-check ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BAD_INPUT
    except OSError as exc:  # the filesystem said no: still the user's input, still one line
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}", EXIT_BAD_INPUT)
    except MemoryError:
        return _fail("ran out of memory", EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:
        if os.environ.get("GAC_DEBUG"):
            raise
        return _fail(f"internal error ({type(exc).__name__}: {exc}); rerun with GAC_DEBUG=1 "
                     "for the traceback and please report it", EXIT_INTERNAL)


def _fail(message: str, code: int) -> int:
    """Write ``gac-check: message`` as exactly one printable line, however odd the message."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message[:2000])
    text += "..." if len(message) > 2000 else ""
    sys.stderr.write(f"gac-check: {text.encode('utf-8', 'backslashreplace').decode()}\n")
    return code


def run(args: argparse.Namespace) -> int:
    """Dispatch to the job the options ask for; each job module runs one."""
    resolve_profile(args.gpu)  # an unknown --gpu is bad input before anything is read
    if args.targets:  # targets are imported only where a check names one
        from gac_check.targets.spec import parse_target

        args.targets = [parse_target(t) for t in args.targets]  # an unknown one: bad input
    if args.base and not args.realign:
        raise BadInput("--base is only used with --realign")
    if args.uniform and not args.repair:
        raise BadInput("--uniform is only used with --repair")
    if args.repair and args.realign:
        raise BadInput("--repair and --realign write different models; choose one")
    if args.repair or args.realign:  # they rewrite one local directory: refuse the rest
        from gac_check.cli.check import local_model

        args.model_dir = local_model(args, "--repair" if args.repair else "--realign")
    if args.repair:
        from gac_check.cli.repair import run_repair

        return run_repair(args)
    if args.realign:
        from gac_check.cli.realign import run_realign

        return run_realign(args)
    from gac_check.cli.check import run_check

    return run_check(args)


if __name__ == "__main__":
    raise SystemExit(main())
