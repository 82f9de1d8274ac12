"""Cost of reading a GGUF header: gac-check's bounded reader against ``gguf.GGUFReader``.

What dominates a real GGUF header is the tokenizer: Llama-3's 128,256 token strings, their
types and 280,147 merges (~9 MB). ``--build PATH`` writes a GGUF with tables of those sizes
(synthetic strings of similar length) around a tiny pruned Llama's tensors (the tensors' count
and size do not change what either reader does with the metadata). ``--read PATH`` times one
reader in-process: ``ours`` (``read_gguf_header``) or ``gguf`` (``gguf.GGUFReader``, which
builds one numpy array per string).

    .venv/bin/python benchmarks/bench_gguf_header.py --build /tmp/gguf-bench.gguf
    .venv/bin/python benchmarks/bench_gguf_header.py --read /tmp/gguf-bench.gguf --reader ours
    B=".venv/bin/python benchmarks/bench_gguf_header.py --read /tmp/gguf-bench.gguf"
    farm-bench -n 3 --warmup 0 --timeout 900 --vs "$B --reader gguf" -- $B --reader ours

It prints the median seconds per read over ``--repeat`` reads.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB, MERGES = 128_256, 280_147


def build(path: Path) -> None:
    import gguf

    sys.path.insert(0, str(ROOT))
    from tests.gguf_files import PRUNED, llama_tensors, q4_k_m_types, write_tensors

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(PRUNED["layers"])
    w.add_embedding_length(PRUNED["hidden"])
    w.add_feed_forward_length(PRUNED["ff"])
    w.add_head_count(PRUNED["heads"])
    w.add_head_count_kv(PRUNED["kv_heads"])
    w.add_file_type(15)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i:07d}".encode() for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges([f"a{i} b{i}" for i in range(MERGES)])
    write_tensors(w, llama_tensors(PRUNED), q4_k_m_types(PRUNED))


def read(path: Path, reader: str, repeat: int) -> float:
    if reader == "ours":
        from gac_check.checkpoint.gguf_header import read_gguf_header as run
    else:
        from gguf import GGUFReader as run
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        run(path)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path)
    ap.add_argument("--read", type=Path)
    ap.add_argument("--reader", choices=("ours", "gguf"), default="ours")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    if args.build:
        build(args.build)
    if args.read:
        print(f"{args.reader}: {read(args.read, args.reader, args.repeat):.3f} s per read")


if __name__ == "__main__":
    main()
