"""A sharded safetensors checkpoint's names (gac_check/checkpoint/index.py): a tensor in two
shards would make one copy silently win, so it is refused naming both files; the shards as
save_pretrained wrote them read every tensor once. Seen red under its mutant."""
from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from gac_check.checkpoint.index import open_checkpoint
from gac_check.errors import BadInput
from tests import helpers


@pytest.mark.parametrize("same", [True, False])
def test_a_tensor_in_two_shards_is_refused(tmp_path: Path, same: bool) -> None:
    """save_pretrained's own shards (with their index), then one tensor of the first shard
    written into the second as well: with the same bytes or others, it is refused."""
    model = helpers.tiny_llama()
    root = tmp_path / "model"
    model.save_pretrained(root, max_shard_size="40KB")
    shards = sorted(root.glob("model-*.safetensors"))
    assert len(shards) >= 2
    ckpt = open_checkpoint(root)
    assert set(ckpt.tensors) == set(model.state_dict())
    first, second = load_file(shards[0]), load_file(shards[-1])
    name = sorted(first)[0]
    second[name] = first[name] if same else first[name] + 1
    save_file(second, shards[-1], metadata={"format": "pt"})
    with pytest.raises(BadInput, match=rf"tensor '{name}' is also in {shards[0].name}"):
        open_checkpoint(root)
