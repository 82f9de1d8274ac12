"""Builders the tests share: the CLI (:func:`gac`, in this process or as a subprocess), tiny
stock models, checkpoint writers, and digests that prove an input untouched.

Imported as ``from tests.helpers import ...`` (the repository root is on ``sys.path``: its
conftest.py puts it there); the fixtures built on these live in tests/conftest.py.

The tiny stock models (``tiny_llama``, ``tiny_qwen2``, ... and their base configs) are
:mod:`gac_check.testing.models`, re-exported here; the public module is the one source, shared
with the hypothesis strategies and with users of the plugin.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import math
import os
import pty
import select
import shutil
import struct
import subprocess
import sys
import termios
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import torch
from torch import nn

from gac_check.testing.models import (  # noqa: F401  (re-exported for the tests)
    BERT,
    LLAMA,
    MISTRAL,
    QWEN2,
    tiny,
    tiny_bert,
    tiny_llama,
    tiny_mistral,
    tiny_qwen2,
)

#: Seconds a CLI run may take before the test fails instead of hanging (the tiny models here
#: check in about a second; repairs and the hostile corpus pass their own limits).
CLI_TIMEOUT = 120

#: The overrides of the hostile corpus's and the fuzzers' seed Llama (the ``tiny_checkpoints``
#: fixture): an MLP of 170 is an error on a GPU contract, so every check has findings to
#: report and every repair something to pad.
SEED_LLAMA = {"intermediate_size": 170}


def decaying(shape: torch.Size) -> torch.Tensor:
    """A weight with singular values exp(-k/6): a few directions carry it, as in trained
    models, so "approximates W" means something (a random init's spectrum is flat)."""
    m, n = shape
    u, _ = torch.linalg.qr(torch.randn(m, m))
    v, _ = torch.linalg.qr(torch.randn(n, n))
    k = min(m, n)
    return (u[:, :k] * torch.exp(-torch.arange(k) / 6.0)) @ v[:, :k].T


# ------------------------------------------------------------------------------ the CLI
def realign_json(model: Path, out: Path, *args: object) -> dict:
    """``gac-check MODEL --realign OUT ARGS --format json``, which must succeed: its document."""
    run = gac(model, "--realign", out, "--format", "json", *args)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def plan_ranks(doc: dict) -> dict[str, int]:
    """Each matrix's rank in a realign document's plan."""
    return {c["name"]: c["rank"] for c in doc["plan"]["choices"]}


def save_pretrained(model: nn.Module, root: Path) -> Path:
    """``model.save_pretrained(root)``; returns ``root``."""
    model.save_pretrained(root)
    return root


def assert_padding_exact(got: torch.Tensor, want: torch.Tensor) -> None:
    """``got`` (the padded model's output) equals ``want`` up to summation order.

    Zero padding adds exact zero products, but a longer reduction is blocked differently by
    the CPU's BLAS, so the sums may associate in another order: the bound is a few units in
    the last place of the dtype, scaled by the output's magnitude (1e-5 in float32, 1e-12 in
    float64), never 0, which holds on one CPU and fails on the next.
    """
    eps = 1e-12 if want.dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got, want, rtol=eps, atol=eps * want.abs().max().item())


def assert_same_routing(want: list, got: list, top_k: int) -> None:
    """Each MoE layer's router scores agree up to summation order (they are computed from
    hidden states that passed through padded GEMMs) and the experts each token is sent to
    are the same, exactly, wherever the k-th and next scores are not tied within that bound.
    """
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        w, g = (w[0], g[0]) if isinstance(w, tuple) else (w, g)
        assert_padding_exact(g, w)
        eps = 1e-5 * max(w.abs().max().item(), 1.0)
        top = w.float().topk(min(top_k + 1, w.shape[-1]), dim=-1)
        decided = (top.values[..., top_k - 1] - top.values[..., -1] > 4 * eps
                   if top_k < w.shape[-1] else torch.ones(w.shape[:-1], dtype=torch.bool))
        chosen = [t.topk(top_k, dim=-1).indices.sort(dim=-1).values for t in (w, g)]
        assert decided.any(), "every token's routing is a tie: the check compares nothing"
        assert torch.equal(chosen[0][decided], chosen[1][decided])


def check_json(model: Path, *args: object) -> dict:
    """The CLI's JSON document of ``model`` checked for an H100 (exit 0 or 1 expected)."""
    run = gac(model, "--gpu", "h100", "--format", "json", *args)
    assert run.returncode in (0, 1), run.stderr
    return json.loads(run.stdout)


def sites_by_role(doc: dict, role: str) -> dict[str, int]:
    """Each site of ``role`` in a check's JSON document, name -> value."""
    return {s["name"]: s["value"] for s in doc["sites"] if s["role"] == role}


def rewrite_safetensors(root: Path, edit: Callable[[dict], None]) -> None:
    """Edit the saved tensors of ``root/model.safetensors`` (real ones, read back) in place
    and write the file again."""
    from safetensors.torch import load_file, save_file

    path = root / "model.safetensors"
    state = load_file(path)
    edit(state)
    save_file(state, path, metadata={"format": "pt"})


def module_inputs(model: nn.Module, tok, modules: list[str],
                  text: str) -> dict[str, torch.Tensor]:
    """Every token's input to each of ``modules`` with ``model`` run on each line of
    ``text`` (the tests' own forward pre-hooks, in float64): what gac-check's calibration
    reads, computed independently of it."""
    seen: dict[str, list[torch.Tensor]] = {m: [] for m in modules}
    hooks = [model.get_submodule(m).register_forward_pre_hook(
        lambda _mod, args, m=m: seen[m].append(args[0].reshape(-1, args[0].shape[-1])))
        for m in modules]
    with torch.no_grad():
        for line in text.splitlines():
            model(**tok(line, return_tensors="pt"))
    for h in hooks:
        h.remove()
    return {m: torch.cat(v).double() for m, v in seen.items()}


def gac(*args: object, timeout: float | None = CLI_TIMEOUT, cwd: Path | None = None,
        env: Mapping[str, str | None] | None = None, process: bool = False,
        **kwargs: object) -> subprocess.CompletedProcess:
    """``gac-check ARGS``, output captured as text; no ``check``: the exit code is the caller's
    to assert.

    In this process by default (:func:`in_process`: ``gac_check.cli.main.main`` with its own
    stdout, stderr, working directory and environment), which saves each run the 2-4 s a fresh
    interpreter pays importing torch and transformers. ``process=True``, or any keyword for
    :func:`subprocess.run` (``preexec_fn``, ...), runs ``python -m gac_check.cli`` as a real
    subprocess instead: where the process is the point (resource limits, signals, a crash
    that must not take the test session with it); so does an ``env`` setting any ``HF_*``
    variable, which huggingface_hub reads once, when it is first imported.

    Either way the run sees this process's environment without ``GAC_DEBUG`` (set, the CLI
    re-raises internal errors as tracebacks instead of its one-line contract, which tests
    assert); ``env`` sets variables on top of that, a None value removing one. ``timeout``
    fails a hung run instead of blocking the session.
    """
    if process or kwargs or any(key.startswith("HF_") for key in env or {}):
        return gac_process(*args, timeout=timeout, cwd=cwd, env=env, **kwargs)
    from gac_check.cli.main import main

    return in_process(main, *args, timeout=timeout, cwd=cwd, env=env)


def gac_process(*args: object, timeout: float | None = CLI_TIMEOUT, cwd: Path | None = None,
                env: Mapping[str, str | None] | None = None,
                **kwargs: object) -> subprocess.CompletedProcess:
    """``gac-check ARGS`` as a real subprocess (``python -m gac_check.cli``); see :func:`gac`.
    Other keywords go to :func:`subprocess.run`."""
    child = {k: v for k, v in os.environ.items() if k != "GAC_DEBUG"}
    for key, value in (env or {}).items():
        if value is None:
            child.pop(key, None)
        else:
            child[key] = value
    return subprocess.run([sys.executable, "-m", "gac_check.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=child,
                          **kwargs)


def in_process(main: Callable[[list[str]], int | None], *args: object,
               timeout: float | None = CLI_TIMEOUT, cwd: Path | None = None,
               env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """``main(ARGS)`` run the way ``python -m`` would run it, but in this process: what it
    writes to stdout and stderr captured (Python warnings and log records included, under
    the interpreter's default warning filters), ``cwd`` and ``env`` (as in :func:`gac`, without
    ``GAC_DEBUG``) in force and restored after, ``SystemExit`` taken as the exit code and an
    escaping exception as its traceback on stderr and exit 1, as an interpreter reports it.

    It runs in a worker thread so that a hung run fails after ``timeout`` seconds
    (:class:`subprocess.TimeoutExpired`) instead of blocking the session.
    """
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    result: list[int] = []

    def target() -> None:
        try:
            code = main(argv)
        except SystemExit as exc:
            code = _exit_code(exc, err)
        except BaseException:  # what an interpreter would print, and exit 1
            traceback.print_exc(file=err)
            code = 1
        result.append(0 if code is None else code)

    with (_environment(env), contextlib.chdir(cwd or os.getcwd()), _log_records_to(err),
          contextlib.redirect_stdout(out), contextlib.redirect_stderr(err),
          _default_warnings(err)):
        worker = threading.Thread(target=target, name=f"in-process {argv[:1]}", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise subprocess.TimeoutExpired(argv, timeout or 0, out.getvalue(), err.getvalue())
    return subprocess.CompletedProcess(argv, result[0], out.getvalue(), err.getvalue())


def _exit_code(exc: SystemExit, err: io.StringIO) -> int:
    """The exit status ``SystemExit(code)`` gives a process (a message: printed, then 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    err.write(f"{exc.code}\n")
    return 1


@contextlib.contextmanager
def _environment(env: Mapping[str, str | None] | None) -> Iterator[None]:
    """``os.environ`` without ``GAC_DEBUG`` and with ``env`` applied, restored on exit."""
    saved = dict(os.environ)
    os.environ.pop("GAC_DEBUG", None)
    for key, value in (env or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _log_records_to(stream: io.StringIO) -> Iterator[None]:
    """Every stream handler that writes to stderr (transformers' and huggingface_hub's,
    created when they were first imported) writes to ``stream`` instead, as it would to a
    fresh process's stderr."""
    stderrs = {id(sys.__stderr__), id(sys.stderr)}
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    moved = [(h, h.stream) for lg in loggers for h in lg.handlers
             if type(h) is logging.StreamHandler and id(h.stream) in stderrs]
    for handler, _ in moved:
        handler.setStream(stream)
    try:
        yield
    finally:
        for handler, original in moved:
            handler.setStream(original)


@contextlib.contextmanager
def _default_warnings(stream: io.StringIO) -> Iterator[None]:
    """A fresh interpreter's warning filters (deprecations and resource warnings hidden, the
    rest shown once per place) with warnings printed to ``stream``, not recorded by pytest."""
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        stream.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.resetwarnings()
        for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                      ResourceWarning):
            warnings.simplefilter("ignore", quiet)
        warnings.showwarning = show
        yield


def pytest_here(pytester: pytest.Pytester, *args: object,
                env: Mapping[str, str | None] | None = None) -> pytest.RunResult:
    """``pytest -p no:cacheprovider ARGS`` in ``pytester.path``, run in this process (the way
    pytest plugins are tested): the plugin is loaded as it would be there, through the
    ``pytest11`` entry point or ``-p``. The outer run's xdist and hypothesis variables are
    removed, so the inner run is not taken for an xdist worker; ``env`` as in :func:`gac`."""
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith(("PYTEST_", "HYPOTHESIS")):
                mp.delenv(key)
        for key, value in (env or {}).items():
            if value is None:
                mp.delenv(key, raising=False)
            else:
                mp.setenv(key, value)
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *map(str, args),
                                              plugins=[_ModuleKeeper(pytester.path)])
    put_back_libraries()
    return result


#: The modules an in-process pytester run imported from libraries (see :class:`_ModuleKeeper`).
_LIBRARIES: dict[str, object] = {}


class _ModuleKeeper:
    """Pytester's in-process run drops from ``sys.modules`` every module the inner run imported
    (its snapshots, restored as the run ends and again at the test's teardown). For torch or
    transformers that is fatal to the rest of the session: the next import executes their
    modules a second time, and torch's operator registry and transformers' lazy modules do not
    survive it (``LlamaConfig`` could not be imported with tests/test_targets_plugin.py run
    before tests/test_readme_gate.py in one worker). This plugin records, as the inner session
    ends, the modules not loaded from the inner project's directory (its test files and
    conftest); :func:`put_back_libraries` returns them, so each library is imported once per
    process, as in a real run."""

    def __init__(self, project: Path) -> None:
        self._project = str(project)

    def pytest_unconfigure(self) -> None:
        for name, module in sys.modules.items():
            if not (getattr(module, "__file__", None) or "").startswith(self._project):
                _LIBRARIES.setdefault(name, module)


def put_back_libraries() -> None:
    """Return to ``sys.modules`` what :class:`_ModuleKeeper` recorded and a snapshot dropped
    (after the run, and after the test's teardown: tests/conftest.py)."""
    for name, module in _LIBRARIES.items():
        sys.modules.setdefault(name, module)


def gac_on_terminal(*args: object, env: Mapping[str, str] | None = None,
                    timeout: float = 300, answers: bytes = b"",
                    cwd: Path | None = None) -> tuple[int, str]:
    """Run the CLI with stderr on a 100-column pseudo-terminal, as a person at a terminal sees
    it (progress bars draw only there); returns the exit code and what reached the terminal.
    With ``answers`` (a command that asks), stdin and stdout are that terminal too and the
    answers are typed into it. A child still silent after ``timeout`` fails the test, never
    hangs it."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))  # rows, cols
    proc = subprocess.Popen([sys.executable, "-m", "gac_check.cli", *map(str, args)], cwd=cwd,
                            stdin=side if answers else None,
                            stdout=side if answers else subprocess.DEVNULL, stderr=side, env=env)
    os.close(side)
    os.write(main, answers)
    chunks = []
    while select.select([main], [], [], timeout)[0]:
        try:
            data = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    code = proc.wait(timeout=timeout)
    os.close(main)
    return code, b"".join(chunks).decode(errors="replace")


# --------------------------------------------------------------- compressed models in memory
def prune_linear(lin: nn.Linear, rows: torch.Tensor | None = None,
                 cols: torch.Tensor | None = None) -> nn.Linear:
    """A new nn.Linear holding only ``rows`` (outputs) and ``cols`` (inputs) of ``lin``."""
    w = lin.weight.data
    w = w[rows] if rows is not None else w
    w = w[:, cols] if cols is not None else w
    new = nn.Linear(w.shape[1], w.shape[0], bias=lin.bias is not None)
    new.weight.data = w.clone()
    if lin.bias is not None:
        new.bias.data = lin.bias.data[rows].clone() if rows is not None else lin.bias.data
    return new


def llm_pruner(layers: range, ratio: float, drop_heads: int, head_dim: int = 16) -> nn.Module:
    """Block-wise LLM-Pruner on a 4-layer :func:`tiny_llama`: whole heads out of q/k/v/o (the
    first ``drop_heads``), single channels out of the MLP (``ratio`` of them, at random), in
    ``layers``; the config keeps the dense sizes, as LLM-Pruner leaves it."""
    model = tiny_llama(num_hidden_layers=4)
    for i in layers:
        attn, mlp = model.model.layers[i].self_attn, model.model.layers[i].mlp
        keep_heads = torch.arange(drop_heads, 4)  # drop the first heads
        rows = (keep_heads[:, None] * head_dim + torch.arange(head_dim)).flatten()
        for p in ("q_proj", "k_proj", "v_proj"):
            setattr(attn, p, prune_linear(getattr(attn, p), rows=rows))
        attn.o_proj = prune_linear(attn.o_proj, cols=rows)
        width = mlp.up_proj.out_features
        keep = torch.randperm(width)[: math.ceil(width * (1 - ratio))].sort().values
        mlp.gate_proj = prune_linear(mlp.gate_proj, rows=keep)
        mlp.up_proj = prune_linear(mlp.up_proj, rows=keep)
        mlp.down_proj = prune_linear(mlp.down_proj, cols=keep)
    return model


def slicegpt(model: nn.Module, dims: dict[str, int]) -> tuple[dict, dict]:
    """SliceGPT's rotate-and-slice of a Llama (:func:`tests.slicegpt.rotate_and_slice`) with
    one width per kind of segment: ``embedding``, ``attn`` and ``mlp`` (the last MLP segment
    keeps the full width, feeding the unsliced head)."""
    from tests.slicegpt import rotate_and_slice

    n = model.config.num_hidden_layers
    widths = [dims["embedding"]] + [dims["attn"], dims["mlp"]] * n
    sd, conf = rotate_and_slice(model, widths[:-1])
    return {k: v.float().contiguous() for k, v in sd.items()}, conf


# ------------------------------------------------------------------ checkpoint writers
def save_torch_state(model: nn.Module, path: Path, name: str = "pytorch_model.bin") -> Path:
    """``model.config.save_pretrained(path)`` and ``torch.save(model.state_dict())`` as
    ``name``: a plain pickled state dict next to its config (Trainer's and older
    transformers' layout). Returns the weights file."""
    model.config.save_pretrained(path)
    torch.save(model.state_dict(), path / name)
    return path / name


def save_llm_pruner(model: nn.Module, path: Path, with_config: bool = True) -> Path:
    """The whole model pickled as LLM-Pruner saves it (``torch.save({'model': model,
    'tokenizer': ...})``), with the model's (dense) config.json unless ``with_config`` is
    False. Returns the weights file."""
    torch.save({"model": model, "tokenizer": None}, path / "pytorch_model.bin")
    if with_config:
        model.config.save_pretrained(path)  # LLM-Pruner never updates the dense sizes
    return path / "pytorch_model.bin"


def save_layouts(model: nn.Module, root: Path, shard_size: str = "150KB") -> dict[str, Path]:
    """``model`` three ways under ``root``: ``single`` (one model.safetensors), ``sharded``
    (safetensors shards of ``shard_size`` and their index) and ``torch`` (the single layout's
    config.json and a torch.save zip of the state dict)."""
    out = {"single": root / "single", "sharded": root / "sharded", "torch": root / "torch"}
    model.save_pretrained(out["single"])
    model.save_pretrained(out["sharded"], max_shard_size=shard_size)
    out["torch"].mkdir()
    shutil.copy(out["single"] / "config.json", out["torch"])
    torch.save(model.state_dict(), out["torch"] / "pytorch_model.bin")
    return out


# ------------------------------------------------------------ proving inputs untouched
def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root with its size and mtime, to prove nothing was written."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under root by content (sha256), every link by its target and, where that is
    a file, its content: to prove a directory's contents untouched."""
    out = {}
    for p in sorted(root.rglob("*")):
        content = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        if p.is_symlink():
            out[str(p.relative_to(root))] = f"-> {os.readlink(p)} {content}".rstrip()
        elif p.is_file():
            out[str(p.relative_to(root))] = content
    return out
