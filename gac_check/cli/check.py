"""``gac-check MODEL ...``: check, print, optionally time the sites and write the reports.

A MODEL is a directory, or a model on the Hugging Face Hub (``hf://ORG/NAME[@REVISION]``, or
``ORG/NAME`` where no such directory exists, as transformers resolves names), checked from
its JSON files and safetensors headers (:mod:`gac_check.checkpoint.hub.remote`). One model prints
and writes what it always did; several (``gac-check A B C``, ``--models-from FILE``) are
checked first, then reported together: each summary, then the zoo table, or one run document
with ``--format json``, one HTML with ``--report`` (:mod:`gac_check.report.zoo`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from gac_check.analysis import CheckResult
from gac_check.api import sources
from gac_check.api.flows import check
from gac_check.api.sources import is_remote, is_remote_checkpoint, local_dir
from gac_check.checkpoint.files import open_regular
from gac_check.checkpoint.hub.limits import check_environment
from gac_check.checkpoint.index import Checkpoint
from gac_check.cli.exits import exit_code
from gac_check.errors import BadInput
from gac_check.progress import steps
from gac_check.report.outputs import plan as plan_outputs
from gac_check.report.outputs import write as write_outputs
from gac_check.report.text import render_text

#: A --models-from file larger than this is not a list of model names.
MAX_LIST_BYTES = 1024 * 1024


def run_check(args: argparse.Namespace) -> int:
    names = model_names(args)
    outputs = None
    for name in names:  # every output path is refused before any model is read
        outputs = plan_outputs(args.report, args.junit, _hub_cache() if is_remote(name)
                               else Path(name), force=args.force)
    results = [check_model(name, args) for name in
               steps(names, "checking models", enabled=len(names) > 1 and args.output != "json")]
    bench = _bench(results) if args.bench else None
    if len(results) == 1:  # the JSON document only where it is printed or written
        doc = _document(results[0]) if args.output == "json" or outputs.wanted else {}
        _print_one(args, results[0], doc, bench and bench[0])
        write_outputs(outputs, doc, args.fail_on)
    else:
        from gac_check.report.zoo import write_zoo  # several models only

        docs = [_document(r) for r in results]  # after --bench: its figures take precedence
        _print_zoo(args, results, docs, bench)
        write_zoo(outputs, docs, args.fail_on)
    return exit_code([f for r in results for f in r.findings], args.fail_on)


def model_names(args: argparse.Namespace) -> list[str]:
    """The MODEL arguments, then the names in ``--models-from`` (one a line, ``#`` comments)."""
    names = [str(m) for m in args.models]
    if getattr(args, "models_from", None):
        names += _names_in(Path(args.models_from))
    if not names:
        raise BadInput("name a model: a directory, or hf://ORG/NAME[@REVISION] "
                       "(several, or --models-from FILE, for a model-zoo report)")
    return names


def _names_in(path: Path) -> list[str]:
    with open_regular(path) as fh:
        raw = fh.read(MAX_LIST_BYTES + 1)
    if len(raw) > MAX_LIST_BYTES:
        raise BadInput(f"is larger than {MAX_LIST_BYTES} bytes, too large for a list of models",
                       path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("is not UTF-8 text", path) from None
    names = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    names = [n for n in names if n]
    if not names:
        raise BadInput("names no models (one directory or hf://ORG/NAME a line)", path)
    return names


def _hub_cache() -> Path:
    """Where the Hub cache is: reports about a Hub model must not land inside it."""
    check_environment()  # a timeout variable huggingface_hub cannot read: one line, not a crash
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def local_model(args: argparse.Namespace, job: str) -> Path:
    """The one local directory ``--repair`` / ``--realign`` rewrites: they need the weights."""
    names = model_names(args)
    if len(names) != 1:
        raise BadInput(f"{job} writes one model; name one model directory, not {len(names)}")
    return local_dir(names[0], job)


def open_model(name: str, args: argparse.Namespace) -> Checkpoint:
    """A directory's index, or a Hub model's from its headers (bounded by the --hub-* limits)."""
    limits = None
    if is_remote(name):
        from gac_check.checkpoint.hub.limits import Limits

        given = {k: getattr(args, f"hub_{k}", None) for k in ("timeout", "max_bytes",
                                                               "max_requests")}
        limits = Limits(**{k: v for k, v in given.items() if v is not None})
    return sources.open_model(name, limits)


def check_model(name: str, args: argparse.Namespace) -> CheckResult:
    start = time.perf_counter()
    ckpt = open_model(name, args)
    seconds = time.perf_counter() - start
    result = check(ckpt, args.gpu, args.dtype, getattr(args, "targets", ()))
    for note in getattr(getattr(ckpt, "fetch", None), "notes", []):
        sys.stderr.write(f"gac-check: note: {_printable(note)}\n")
    if getattr(args, "verbose", False):
        sys.stderr.write(f"gac-check: {_read_line(ckpt, seconds)}\n")
    return result


def _printable(text: str) -> str:
    """One printable line of at most 500 characters (a note may quote a hostile name)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:500])
    return text.encode("utf-8", "backslashreplace").decode()


def _read_line(ckpt: Checkpoint, seconds: float) -> str:
    """What reading a model cost: bytes fetched and requests for a Hub model, time for both."""
    files = len(ckpt.files)
    if not is_remote_checkpoint(ckpt):
        return f"{ckpt.source}: read {files} weight file header(s) in {seconds:.2f} s"
    f = ckpt.fetch  # type: ignore[attr-defined]
    via = "offline, from the cache" if f.offline else f"{f.requests} HTTP response(s)"
    return (f"{ckpt.source}: fetched {f.bytes:,} bytes ({via}) in {f.seconds:.2f} s; "
            f"{files} weight file header(s), {f.headers_cached} from the cache")


def _bench(results: list[CheckResult]) -> list:
    from gac_check.bench.model_bench import bench_findings  # imports torch: only on --bench
    from gac_check.contract.evidence import adopt_bench

    reports = [bench_findings(r) for r in results]
    for result, report in zip(results, reports, strict=True):
        adopt_bench(result.findings, report, result.contract)
    return reports


def _print_one(args: argparse.Namespace, result: CheckResult, doc: dict, bench) -> None:
    if args.output == "json":
        if bench is not None:
            doc["bench"] = dataclasses.asdict(bench)
        print(json.dumps(doc, indent=2))
        return
    print(render_text(result, doc or None))
    if bench is not None:
        from gac_check.bench.model_bench import render

        print(render(bench))


def _document(result: CheckResult) -> dict:
    """The check's JSON document; its module is imported only where one is printed or
    written (a plain check's text needs none)."""
    from gac_check.report.json_report import to_json

    return to_json(result)


def _print_zoo(args: argparse.Namespace, results: list[CheckResult], docs: list[dict],
               bench: list | None) -> None:
    from gac_check.report.run import dumps
    from gac_check.report.zoo import render_zoo, zoo_run

    if args.output == "json":
        for doc, b in zip(docs, bench or [None] * len(docs), strict=True):
            if b is not None:
                doc["bench"] = dataclasses.asdict(b)
        print(dumps(zoo_run(docs, "zoo", args.fail_on)), end="")
        return
    for i, result in enumerate(results):
        print(render_text(result, docs[i]))
        if bench is not None:
            from gac_check.bench.model_bench import render

            print(render(bench[i]))
        print()
    print(render_zoo(docs))
