"""Axis labels the sizes of two builds cannot give alone, fixed from the class's structure.

:mod:`.derive_table` names an axis by the width its sizes match in both builds. A gated MLP
that fuses gate and up into one projection of ``ffn_dim`` rows and reads half of it back
(Moshi's ``MoshiGatingMLP``: ``fc1`` out ``ffn_dim``, ``fc2`` in ``ffn_dim // 2``) matches
``inter`` and ``inter_half``; the GEMM width is the half, so the fused producer is two
halves of it (``inter2``) and the consumer's half is the width (``inter``).

An embedding's rows past the vocabulary's (``vocab1``: Moshi's ``vocab_size + 1``) are a
table length, read by a gather, no GEMM; on any other module the same size stays unnamed.
"""
from __future__ import annotations


def halve_gated(tensors: dict[str, dict]) -> bool:
    """Relabel each module that reads half of a producer's ``inter`` rows back (Moshi: both
    labels in one module); whether any was. A module whose GEMMs are all half its config's
    MLP width (RecurrentGemma: ``intermediate_size // 2``, no ``inter`` axis) keeps
    ``inter_half``: :mod:`.derived` reads it as such and its repair doubles the key."""
    axes: dict[str, set[str]] = {}
    for p, t in tensors.items():
        axes.setdefault(p.rsplit(".", 2)[0], set()).update(t["axes"])
    modules = {m for m, labels in axes.items() if {"inter", "inter_half"} <= labels}
    for pattern, tensor in tensors.items():
        if pattern.rsplit(".", 2)[0] in modules:
            tensor["axes"] = [{"inter": "inter2", "inter_half": "inter"}.get(a, a)
                              for a in tensor["axes"]]
    return bool(modules)


def without_halved(keys: dict[str, str], halved: bool) -> dict[str, str]:
    """The config keys per role, less the MLP width's where the config records twice it: a
    repair must refuse to pad a width whose config key it cannot write, never write it."""
    return {r: k for r, k in keys.items() if not (halved and r == "inter")}


def table_rows(tensors: dict[str, dict]) -> None:
    """Keep ``vocab1`` on embeddings only: a GEMM with vocab + 1 rows is a width to judge."""
    for tensor in tensors.values():
        if tensor["kind"] != "embedding":
            tensor["axes"] = ["?" if a == "vocab1" else a for a in tensor["axes"]]


def mark_tied(model, tensors: dict[str, dict]) -> None:
    """Each embedding the class ties to another (``all_tied_weights_keys``: ProphetNet's
    decoder embedding to its shared one) records that one as ``tied``:
    ``save_pretrained`` writes only the target, so the alias is not missing when it holds."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    for alias, target in tied.items():  # an LM head's tie is config.json's to say
        if alias in tensors and tensors[alias]["kind"] == "embedding" and isinstance(target, str):
            tensors[alias]["tied"] = target


def label_mla(model, kinds: dict[str, str], saved: dict[str, str], tensors: dict[str, dict],
              pattern) -> None:
    """Label ``mla`` every width inside a multi-head latent attention (a module holding
    ``kv_a_proj_with_mqa``: LongCat-Flash's two per layer) but the hidden one: the latents
    and per-head sizes are read from the tensors by :func:`.mla.layer_sites`, as DeepSeek's."""
    modules = [n for n, m in model.named_modules() if hasattr(m, "kv_a_proj_with_mqa")
               and hasattr(m, "kv_b_proj")]
    for name in kinds:
        if any(name.startswith(m + ".") for m in modules):
            entry = tensors.get(pattern(saved[name]))
            if entry is not None:
                entry["axes"] = [a if a == "hidden" else "mla" for a in entry["axes"]]
