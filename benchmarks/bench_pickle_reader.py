"""Cost of reading a whole pickled model the way a check does (issue 21, item 2).

A whole pickled model (LLM-Pruner's ``torch.save({'model': model, 'tokenizer': ...})``) costs
what its pickle opcodes cost, not what its weights weigh, so the model built here is tiny but
wide: an 80-layer Llama with hidden size 64, saved whole, as LLM-Pruner saves it (no
config.json: the pickle is all there is). Nothing is downloaded.

The timed work is what checking such a directory does with its pickle, through public entry
points only: ``open_checkpoint`` (indexes the tensors from ``data.pkl``) and ``check`` (reads
what the pickled modules say: head_dim, rotary buffers, the pickled config). Run it under each
version to compare (``PYTHONPATH`` pointing at another checkout times that one); ``--build DIR``
writes the model once so both versions read the same file:

    .venv/bin/python benchmarks/bench_pickle_reader.py --build /tmp/pickled-llama
    .venv/bin/python benchmarks/bench_pickle_reader.py --read /tmp/pickled-llama --repeat 10
    .venv/bin/python benchmarks/bench_pickle_reader.py --read /tmp/pickled-llama --listing

It prints the median CPU and wall seconds per read over ``--repeat`` reads (each in the same
process, after one warm-up read); on a shared machine the CPU figure is the steadier one.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

LAYERS, HIDDEN, HEADS, MLP, VOCAB = 80, 64, 4, 172, 256


def build(root: Path) -> None:
    """An LLM-Pruner-style whole-model pickle: pruned MLP width, fp16, no config.json."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                         intermediate_size=MLP, num_hidden_layers=LAYERS, vocab_size=VOCAB)
    model = LlamaForCausalLM(config).half().eval()
    root.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model, "tokenizer": None}, root / "pytorch_model.bin")


def read_once(root: Path) -> int:
    """Check the directory as ``gac-check DIR`` does; returns the tensor count.

    Before issue 21 the pickled-model reader kept its last results by file stamp; that cache is
    emptied first, so each read costs what a check's one read of the file costs.
    """
    from gac_check.analysis import check

    old = sys.modules.get("gac_check.checkpoint.pickletree")
    if hasattr(old, "_pickled_model"):
        old._pickled_model.cache_clear()
    return len(check(root, "gpu").checkpoint.tensors)


def list_once(root: Path) -> int:
    """Only the listing: index the tensors of the pickle, nothing else (``--listing``)."""
    from gac_check.checkpoint.pickled.torchzip import read_torch_zip

    return len(read_torch_zip(root / "pytorch_model.bin"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=Path, help="write the pickled model into this directory")
    ap.add_argument("--read", type=Path, help="time reading the model in this directory")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--listing", action="store_true",
                    help="time read_torch_zip alone instead of a whole check")
    args = ap.parse_args()
    if args.build:
        build(args.build)
        size = (args.build / "pytorch_model.bin").stat().st_size
        print(f"wrote {args.build / 'pytorch_model.bin'} ({size} bytes)")
    if args.read:
        read = list_once if args.listing else read_once
        count = read(args.read)  # warm-up: imports, first-call caches
        wall, cpu = [], []
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            read(args.read)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        print(f"{count} tensors: median {statistics.median(cpu):.4f} s CPU, "
              f"{statistics.median(wall):.4f} s wall per read (CPU min {min(cpu):.4f}, "
              f"max {max(cpu):.4f}; {args.repeat} reads)")


if __name__ == "__main__":
    main()
