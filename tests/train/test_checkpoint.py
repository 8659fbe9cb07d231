import json

import pytest
import torch

from vlp.config import ModelConfig
from vlp.errors import CheckpointError
from vlp.models.albef import ALBEF
from vlp.weights import find_checkpoint, load_weights, read_state, save_checkpoint


def small_model(seed: int, queue_size: int = 16) -> ALBEF:
    torch.manual_seed(seed)
    return ALBEF(ModelConfig(queue_size=queue_size, embed_dim=32))


def test_strict_round_trip_restores_every_tensor(tmp_path):
    a = small_model(0)
    with torch.no_grad():  # make online, momentum and queue state all differ from a fresh init
        for p in a.parameters():
            p.add_(0.01)
        a.momentum.update()
        a.queue.enqueue(torch.arange(5), image=torch.randn(5, 32), text=torch.randn(5, 32))
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000003", a, {"step": 3, "note": "x"})
    b = small_model(1)
    load_weights(b, ckpt)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert b.mlm_head.decoder.weight is b.text.embeddings.word_embeddings.weight  # still tied
    assert b.queue.ptr.item() == 5
    assert read_state(ckpt) == {"step": 3, "note": "x"}
    assert find_checkpoint(tmp_path / "run") == ckpt


def test_loading_into_a_different_architecture_fails_with_names(tmp_path):
    ckpt = save_checkpoint(tmp_path / "c", small_model(0), {})
    other = small_model(0, queue_size=8)
    with pytest.raises(CheckpointError, match=r"shape mismatches.*queue\.image"):
        load_weights(other, ckpt)


def test_find_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint here"):
        find_checkpoint(tmp_path)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "state.json").write_text(json.dumps({}))
    with pytest.raises(CheckpointError, match="missing model.safetensors"):
        load_weights(small_model(0), tmp_path / "c")
