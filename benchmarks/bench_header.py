"""Cost of reading one safetensors header with safetensors' own rules (issue 11, item 2).

gac-check parses headers itself so that checking stays torch-free; since issue 11 it also
holds them to safetensors' rules (offsets tiling the data exactly, u64 sizes, unique names,
valid UTF-8, bounded JSON). This times :func:`read_safetensors_header` on real headers of two
sizes: a Llama-2-70B-shaped file (723 tensors in one header) and a 100,000-tensor one (a
header of ~9 MB, far past any real checkpoint). The data region is a sparse hole of the right
size (the reader only needs its length), so nothing large touches the disk.

Run it under the code to compare (``PYTHONPATH`` pointing at another checkout times that one):

    .venv/bin/python benchmarks/bench_header.py [--tensors 723] [--repeat 50]

It prints the median seconds per header read over ``--repeat`` reads.
"""
from __future__ import annotations

import argparse
import json
import statistics
import struct
import tempfile
import time
from pathlib import Path

from gac_check.checkpoint.index import read_safetensors_header

LLAMA_70B = {"hidden": 8192, "kv": 1024, "mlp": 28672, "vocab": 32000, "layers": 80}


def shapes(tensors: int) -> dict[str, list[int]]:
    """Llama-2-70B's tensors, then (if more are asked for) small extra ones."""
    c = LLAMA_70B
    h, kv, i = c["hidden"], c["kv"], c["mlp"]
    out: dict[str, list[int]] = {"model.embed_tokens.weight": [c["vocab"], h]}
    for n in range(c["layers"]):
        b = f"model.layers.{n}"
        out |= {f"{b}.self_attn.q_proj.weight": [h, h], f"{b}.self_attn.k_proj.weight": [kv, h],
                f"{b}.self_attn.v_proj.weight": [kv, h], f"{b}.self_attn.o_proj.weight": [h, h],
                f"{b}.mlp.gate_proj.weight": [i, h], f"{b}.mlp.up_proj.weight": [i, h],
                f"{b}.mlp.down_proj.weight": [h, i], f"{b}.input_layernorm.weight": [h],
                f"{b}.post_attention_layernorm.weight": [h]}
    out |= {"model.norm.weight": [h], "lm_head.weight": [c["vocab"], h]}
    extra = 0
    while len(out) < tensors:
        out[f"extra.{extra}.weight"] = [64, 64]
        extra += 1
    return dict(list(out.items())[:tensors])


def write(path: Path, tensors: int) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for name, shape in shapes(tensors).items():
        size = 2
        for d in shape:
            size *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [pos, pos + size]}
        pos += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        fh.truncate(8 + len(blob) + pos)  # the data: a sparse hole of the right length


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensors", type=int, default=723)
    p.add_argument("--repeat", type=int, default=50)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        write(path, args.tensors)
        assert len(read_safetensors_header(path)) == args.tensors
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            read_safetensors_header(path)
            times.append(time.perf_counter() - t0)
    print(f"{args.tensors} tensors: median {statistics.median(times) * 1e3:.3f} ms per header "
          f"(min {min(times) * 1e3:.3f}, max {max(times) * 1e3:.3f}; {args.repeat} reads)")


if __name__ == "__main__":
    main()
