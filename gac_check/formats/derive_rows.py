"""A lookup table's row count in the class table: a length, not a GEMM width.

An embedding's rows are gathered by token id, never multiplied; where they are the vocabulary
they are labelled ``vocab`` (and judged, since a tied head reads the same tensor as its GEMM).
CPM-Ant's ``input_embedding`` holds vocab_size + prompt_types x prompt_length rows
(transformers 5.24.0 ``CpmAntModel.__init__``), a size that moves with the config but matches
no width label, so the table called it ``?`` and the check refused the model. Its head is a
separate ``lm_head`` [vocab_size, hidden] (``CpmAntForCausalLM._tied_weights_keys`` is empty),
which carries the vocabulary GEMM. Such an axis is labelled ``rows``: a table length, read and
accounted like a position table's (:mod:`.derived`), and only in a class that does not tie its
head to the embedding and has a head over the vocabulary.
"""
from __future__ import annotations


def ties_head(model) -> bool:
    """Whether the built class may read its head's GEMM from the embedding's tensor: it ties
    them, or declares a tie (``_tied_weights_keys``) it applies when the config asks. A config's
    ``tie_word_embeddings`` may say True for a class that never ties (CPM-Ant's: the key map is
    empty), and only then is the table's entry untied."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embedding is None:
        return False
    declared = getattr(model, "_tied_weights_keys", None)
    return bool(declared) or getattr(head, "weight", None) is getattr(embedding, "weight", None)


def label_lookup_rows(tensors: dict[str, dict], tied: bool) -> None:
    """Relabel an untied embedding's unnamed row count ``rows`` (in place)."""
    head = any(t["kind"] != "embedding" and "vocab" in t["axes"] for t in tensors.values())
    if tied or not head:
        return
    for tensor in tensors.values():
        if tensor["kind"] == "embedding" and len(tensor["axes"]) == 2 and tensor["axes"][0] == "?":
            tensor["axes"][0] = "rows"
