"""A header-only check against safetensors' own reader listing the same shapes (issue 32).

A Llama-70B-shaped checkpoint (80 layers, 8192 hidden, 8 KV heads, MLP pruned to 27000, one
safetensors file that is a header and a sparse hole, as tests/target_models.sparse_llama
writes it) is checked by ``gac-check`` as a user runs it, and listed by safetensors'
``safe_open`` (every tensor's shape: what a check needs at least), each a whole process.
The goals: the plain check at most 1.3x the bare reader, four deployment targets at most 1.5x
the plain check. Measure with farm-bench, interleaved and paired:

    .venv/bin/python benchmarks/bench_header_check.py --write /tmp/l70
    farm-bench -n 15 --vs '.venv/bin/python benchmarks/bench_header_check.py --list /tmp/l70' \\
        -- .venv/bin/gac-check /tmp/l70 --gpu h100 --fail-on never
    farm-bench -n 15 --vs '.venv/bin/gac-check /tmp/l70 --gpu h100 --fail-on never' \\
        -- .venv/bin/gac-check /tmp/l70 --gpu h100 --fail-on never --target vllm,tp=8,quant=awq \\
        --target vllm,tp=4,quant=gptq --target llama.cpp,quant=Q4_K_M --target tensorrt-llm,tp=2

Say whether gac_check's bytecode was compiled (``python -m compileall gac_check``): with
PYTHONDONTWRITEBYTECODE=1 and no ``__pycache__``, every run compiles the check's modules from
source while safetensors runs from its installed bytecode, and that alone moves the first
ratio from ~0.9x to ~1.4x (benchmarks/RESULTS.md). To time another commit, run it from its own
tree (``env -C TREE python -m gac_check.cli ...``): ``python -m`` puts the working directory
ahead of PYTHONPATH, so from this checkout it would time this checkout's code.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def write(root: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.target_models import sparse_llama

    sparse_llama(root, hidden=8192, intermediate=27000, heads=64, kv_heads=8, layers=80,
                 vocab=128256)


def listing(root: Path) -> int:
    """Every tensor's shape through safetensors' own reader, as few imports as it needs."""
    from safetensors import safe_open

    n = 0
    for file in sorted(root.glob("*.safetensors")):
        with safe_open(file, framework="np") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                n += len(f.get_slice(name).get_shape())
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="write the sparse checkpoint here")
    group.add_argument("--list", type=Path, help="list its shapes with safetensors' reader")
    args = ap.parse_args()
    if args.write:
        write(args.write)
    else:
        listing(args.list)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
