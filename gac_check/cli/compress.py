"""``gac-check compress SRC OUT --ratio R``: the reference low-rank compressor.

Truncated SVD of every transformer-layer linear, written in ASVD's layout with ASVD's rank
formula (:mod:`gac_check.models.compress`), so there is a real compressed checkpoint with the
irregular ranks real tools leave to check, repair and realign. Only parsing and printing live
here; errors reach the one boundary in :func:`gac_check.cli.main.guarded`.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def build_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = parser_class(prog="gac-check compress",
                     description="Compress a transformers model by truncated SVD into ASVD's "
                     "layout (BLinear/ALinear + truncation_ranks): the reference compressor, "
                     "which leaves the irregular ranks real tools leave.")
    p.add_argument("src", type=Path, metavar="SRC", help="the dense model directory")
    p.add_argument("out", type=Path, metavar="OUT",
                   help="where to write the compressed model (appears complete or not at all)")
    p.add_argument("--ratio", type=float, default=0.8,
                   help="fraction of parameters kept per matrix (ASVD's param_ratio, "
                   "default %(default)s)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    return p


def main(argv: Sequence[str], parser_class: type[argparse.ArgumentParser]) -> int:
    args = build_parser(parser_class).parse_args(argv)
    from gac_check.models.compress import compress_dir  # torch and transformers: only here
    from gac_check.threads import set_torch_threads

    set_torch_threads()
    ranks = compress_dir(args.src, args.out, args.ratio, args.force)
    distinct = sorted(set(ranks.values()))
    print(f"compressed {len(ranks)} linears at ratio {args.ratio}: ranks {distinct} -> {args.out}")
    return 0
