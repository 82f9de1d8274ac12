"""Cost of ``gac-check hf://ORG/NAME``: bytes fetched and time for an 8B sharded model (issue 16).

Goals: under 1 MB fetched for an 8B-parameter sharded model, and under 2 s on a local network.

Writes a Llama-3-8B-shaped checkpoint as the Hub holds it: ``config.json`` with the real sizes,
``model.safetensors.index.json``, four ``model-0000N-of-00004.safetensors`` shards (8.03B
bf16 parameters, 16 GB, written as sparse files: the headers are real, the data is a hole the
check never reads), and the sidecars a real repo carries (``generation_config.json``,
``special_tokens_map.json``, a 25 KB ``tokenizer_config.json``, a 7.7 MB ``tokenizer.json`` that
the check must skip by its listed size). It is served by the Hub look-alike the tests use
(:mod:`tests.hub_server`: model info, resolve URLs, LFS redirects to a CDN origin, Range),
with ``--delay-ms`` before every answer to stand for a network's round trip. Then, each a
fresh ``gac-check`` subprocess, as a user runs it:

- cold: a fresh ``HF_HOME`` each run (nothing cached): wall time, and bytes fetched as
  ``--verbose`` reports them and as the server counted them;
- warm: the same ``HF_HOME`` again (listing re-resolved, headers from the cache);
- local: ``gac-check DIR`` on the same files, for comparison.

Runs are interleaved (cold, warm, local, cold, ...); medians are printed.

    .venv/bin/python benchmarks/bench_remote_check.py [--runs 5] [--delay-ms 1]
    .venv/bin/python benchmarks/bench_remote_check.py --serve 600   # serve it for farm-bench
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_check import tensor_shapes  # noqa: E402
from tests.hub_server import HubServer  # noqa: E402

REPO = "meta-llama-like/Llama-3-8B"
GAC = [sys.executable, "-m", "gac_check.cli"]
SHARDS = 4
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
          "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
          "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 8192,
          "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
          "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 128000,
          "eos_token_id": 128001}


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def write_shard(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """A real safetensors header, then a hole as long as the tensors' bf16 bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        size = 2 * numel(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)


def write_model(root: Path) -> tuple[int, int]:
    """The repo's files; returns (parameters, bytes of weights)."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(CONFIG, indent=2))
    shapes = tensor_shapes(CONFIG)
    names = list(shapes)
    per = -(-len(names) // SHARDS)
    weight_map: dict[str, str] = {}
    for s in range(SHARDS):
        file = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        part = {n: shapes[n] for n in names[s * per:(s + 1) * per]}
        write_shard(root / file, part)
        weight_map |= dict.fromkeys(part, file)
    params = sum(numel(s) for s in shapes.values())
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 2 * params}, "weight_map": weight_map}, indent=2))
    (root / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 128000, "eos_token_id": 128001, "do_sample": True,
         "temperature": 0.6, "top_p": 0.9}))
    (root / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}))
    added = {str(128000 + k): {"content": f"<|reserved_special_token_{k}|>", "special": True}
             for k in range(256)}
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": added, "model_max_length": 1000000000000000019884624838656},
        indent=2))
    vocab = {f"tok{k:06d}": k for k in range(128000)}
    merges = [f"t{k} o{k}" for k in range(280000)]
    (root / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab,
                                                               "merges": merges}}))
    (root / "README.md").write_text("# Llama-3-8B-shaped test repository\n")
    return params, sum((root / f).stat().st_size for f in set(weight_map.values()))


def run(cmd: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{cmd} failed ({proc.returncode}): {proc.stderr}")
    return wall, proc


def fetched(stderr: str) -> int:
    m = re.search(r"fetched ([\d,]+) bytes", stderr)
    if not m:
        raise SystemExit(f"no byte count in --verbose output: {stderr!r}")
    return int(m.group(1).replace(",", ""))


def client_env(server: HubServer, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    return env | {"HF_ENDPOINT": server.endpoint, "HF_HOME": str(home), "NO_PROXY": "*",
                  "HF_HUB_DISABLE_TELEMETRY": "1"}


def bench(root: Path, runs: int, delay_ms: float) -> int:
    params, weight_bytes = write_model(root / "model")
    model = root / "model"
    print(f"model: {params / 1e9:.2f}B parameters, {weight_bytes / 1e9:.1f} GB of bf16 weights "
          f"in {SHARDS} shards; server delay {delay_ms} ms per request; load "
          f"{os.getloadavg()[0]:.2f}")
    cold_t, warm_t, local_t, cold_b, warm_b, served = [], [], [], [], [], []
    with HubServer({REPO: {"main": model}}, delay=delay_ms / 1000) as server:
        ref = f"hf://{REPO}"
        cmd = [*GAC, ref, "--gpu", "h100", "--format", "json", "--verbose"]
        run(cmd, client_env(server, root / "warmup"))  # imports compiled, page cache warm
        for i in range(runs):
            home = root / f"home{i}"
            server.reset()
            wall, cold = run(cmd, client_env(server, home))
            served.append(server.bytes_sent)
            cold_t.append(wall)
            cold_b.append(fetched(cold.stderr))
            wall, warm = run(cmd, client_env(server, home))
            warm_t.append(wall)
            warm_b.append(fetched(warm.stderr))
            wall, local = run([*GAC, str(model), "--gpu", "h100", "--format", "json"],
                              client_env(server, home))
            local_t.append(wall)
            same = json.loads(cold.stdout)["sites"] == json.loads(local.stdout)["sites"]
            if not same:
                raise SystemExit("the remote check disagrees with the local check")
    med = statistics.median
    print(f"cold remote check: {med(cold_t):.3f} s (runs {', '.join(f'{t:.3f}' for t in cold_t)})"
          f"; fetched {med(cold_b):,.0f} bytes (server counted {med(served):,.0f})")
    print(f"warm remote check: {med(warm_t):.3f} s; fetched {med(warm_b):,.0f} bytes")
    print(f"local check of the same files: {med(local_t):.3f} s")
    print(f"goals: < 1,000,000 bytes: {'met' if max(cold_b) < 1_000_000 else 'MISSED'}; "
          f"< 2 s: {'met' if max(cold_t) < 2 else 'MISSED'} (cold, slowest run)")
    return 0


def serve(root: Path, seconds: float, delay_ms: float) -> int:
    """Serve the model for an outside timer (farm-bench) until killed or ``seconds`` pass."""
    write_model(root / "model")
    with HubServer({REPO: {"main": root / "model"}}, delay=delay_ms / 1000) as server:
        print(f"HF_ENDPOINT={server.endpoint} model=hf://{REPO} dir={root / 'model'}",
              flush=True)
        time.sleep(seconds)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--delay-ms", type=float, default=0.0,
                    help="wait this long before every answer (a network round trip)")
    ap.add_argument("--serve", type=float, metavar="SECONDS",
                    help="only serve the model this long, for timing with an outside tool")
    ap.add_argument("--keep", type=Path, help="write here and keep the model")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="gac-remote-bench-"))
    try:
        if args.serve:
            return serve(root, args.serve, args.delay_ms)
        return bench(root, args.runs, args.delay_ms)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
