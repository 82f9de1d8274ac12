"""Speed of ``gac-check``: checking must cost what reading headers costs (issue 2, "Speed").

Writes two sharded safetensors Llama checkpoints with the same tensors (names, count, shards)
but 4x different bytes: a 1.1B-parameter TinyLlama-shaped one (~2.2 GB in bf16) and a
~0.28B-parameter one (~0.55 GB). Its MLP width is 5630 (a pruner's kind of size) so there is
something to find. Then, each as a fresh subprocess, as a user runs it:

- ``gac-check`` on the 2 GB checkpoint: median wall time (goal < 1 s) and peak RSS (goal
  < 200 MB, getrusage of the child, measured from a small probe process);
- the same on the 0.5 GB one: the time ratio (goal <= 1.2: time must not grow with bytes);
- ``transformers.AutoModel.from_pretrained`` on the 2 GB directory (goal: gac-check >= 20x
  faster).

Weights are random bytes from one reused buffer (gac-check never reads them; from_pretrained
copies them as they are). Everything is written under a temporary directory and removed.

    .venv/bin/python benchmarks/bench_check.py [--keep DIR] [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BUF = np.random.default_rng(0).integers(0, 256, 64 * 1024 * 1024, dtype=np.uint8).tobytes()
SHARDS = 4
GAC = [sys.executable, "-m", "gac_check.cli"]

BIG = {"hidden_size": 2048, "intermediate_size": 5630, "num_attention_heads": 32,
       "num_key_value_heads": 4, "vocab_size": 32000}
SMALL = {"hidden_size": 1024, "intermediate_size": 2814, "num_attention_heads": 16,
         "num_key_value_heads": 4, "vocab_size": 16000}
COMMON = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 22,
          "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rope_theta": 10000.0}


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(cfg["num_hidden_layers"]):
        b = f"model.layers.{n}"
        shapes |= {f"{b}.self_attn.q_proj.weight": (h, h), f"{b}.self_attn.k_proj.weight": (kv, h),
                   f"{b}.self_attn.v_proj.weight": (kv, h), f"{b}.self_attn.o_proj.weight": (h, h),
                   f"{b}.mlp.gate_proj.weight": (i, h), f"{b}.mlp.up_proj.weight": (i, h),
                   f"{b}.mlp.down_proj.weight": (h, i), f"{b}.input_layernorm.weight": (h,),
                   f"{b}.post_attention_layernorm.weight": (h,)}
    return shapes | {"model.norm.weight": (h,), "lm_head.weight": (v, h)}


def write_bytes(fh, n: int) -> None:
    while n > 0:
        chunk = min(n, len(BUF))
        fh.write(memoryview(BUF)[:chunk])
        n -= chunk


def write_shard(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """A safetensors file written directly: header, then each tensor's bf16 bytes."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset,
                                                                                offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        write_bytes(fh, offset)


def write_checkpoint(root: Path, cfg: dict) -> tuple[int, int]:
    """Sharded like save_pretrained (index + SHARDS files); returns (params, bytes)."""
    root.mkdir(parents=True)
    config = COMMON | cfg
    (root / "config.json").write_text(json.dumps(config))
    shapes = tensor_shapes(config)
    names = list(shapes)
    per = -(-len(names) // SHARDS)
    weight_map = {}
    for s in range(SHARDS):
        file = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        part = {n: shapes[n] for n in names[s * per:(s + 1) * per]}
        write_shard(root / file, part)
        weight_map |= dict.fromkeys(part, file)
    params = sum(int(np.prod(s)) for s in shapes.values())
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 2 * params}, "weight_map": weight_map}))
    return params, sum(p.stat().st_size for p in root.iterdir())


def timed(cmd: list[str], runs: int) -> tuple[float, list[float], str]:
    times, out = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{cmd} failed: {proc.stderr}")
        out = proc.stdout
    return statistics.median(times), times, out


#: Runs a command and prints its peak RSS. A separate small process, because a child forked
#: from this one (which holds BUF) would report this process's pages as its own high-water mark.
RSS_PROBE = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True)"
             "; print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_rss_mb(cmd: list[str]) -> float:
    out = subprocess.run([sys.executable, "-c", RSS_PROBE, *cmd], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[-1]) / 1024  # Linux reports KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", type=Path, help="write here and keep the checkpoints")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="gac-bench-"))
    try:
        return bench(root, args.runs)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def bench(root: Path, runs: int) -> int:
    t0 = time.perf_counter()
    big_params, big_bytes = write_checkpoint(root / "big", BIG)
    small_params, small_bytes = write_checkpoint(root / "small", SMALL)
    print(f"wrote {big_params / 1e9:.2f}B params / {big_bytes / 1e9:.2f} GB and "
          f"{small_params / 1e9:.2f}B params / {small_bytes / 1e9:.2f} GB "
          f"({len(tensor_shapes(COMMON | BIG))} tensors, {SHARDS} shards each) in "
          f"{time.perf_counter() - t0:.1f} s")

    cmd = [*GAC, "--gpu", "auto", "--format", "json"]
    big_t, big_all, out = timed([*cmd, str(root / "big")], runs)
    rss_mb = peak_rss_mb([*cmd, str(root / "big")])
    small_t, small_all, _ = timed([*cmd, str(root / "small")], runs)
    found = json.loads(out)["summary"]
    a100_t, _, _ = timed([*GAC, "--gpu", "a100", str(root / "big")], runs)

    load = ("import sys, time; t = time.perf_counter(); import torch; "
            "from transformers import AutoModel; i = time.perf_counter(); "
            "AutoModel.from_pretrained(sys.argv[1], dtype=torch.bfloat16); "
            "print(i - t, time.perf_counter() - i)")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", load, str(root / "big")], capture_output=True,
                          text=True, check=True)
    hf_t = time.perf_counter() - start
    hf_import, hf_load = map(float, proc.stdout.split()[-2:])

    results = {
        "gac_check_2GB_s": round(big_t, 3), "gac_check_2GB_runs_s": [round(t, 3) for t in big_all],
        "gac_check_0.5GB_s": round(small_t, 3),
        "gac_check_0.5GB_runs_s": [round(t, 3) for t in small_all],
        "gac_check_2GB_gpu_a100_s": round(a100_t, 3),
        "bytes_ratio": round(big_bytes / small_bytes, 2),
        "time_ratio_2GB_over_0.5GB": round(big_t / small_t, 3),
        "peak_rss_MB": round(rss_mb, 1), "bare_python_rss_MB": round(peak_rss_mb(
            [sys.executable, "-c", "pass"]), 1),
        "from_pretrained_s": round(hf_t, 2), "from_pretrained_import_s": round(hf_import, 2),
        "from_pretrained_load_s": round(hf_load, 2),
        "speedup_vs_from_pretrained": round(hf_t / big_t, 1),
        "sites": found["sites"], "misaligned": found["misaligned"],
    }
    print(json.dumps(results, indent=2))
    goals = {
        "gac-check < 1 s on >= 1B params": big_t < 1.0 and big_params >= 1e9,
        "time ratio 2 GB / 0.5 GB <= 1.2": big_t / small_t <= 1.2,
        ">= 20x faster than from_pretrained": hf_t / big_t >= 20,
        "peak RSS < 200 MB": rss_mb < 200,
    }
    for goal, ok in goals.items():
        print(f"{'PASS' if ok else 'FAIL'}  {goal}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
