import pytest
import torch
from safetensors.torch import load_file, save_model

from tests.helpers import narrow_model_config
from vlp.config import ModelConfig
from vlp.models.albef import ALBEF
from vlp.models.nlvr import NLVRModel
from vlp.weights import load_strict, tied_groups

F_LAYERS = 2


def cfg() -> ModelConfig:
    return narrow_model_config(embed_dim=32, queue_size=8, fusion_layers=F_LAYERS)


def nlvr(head: str = "cls", seed: int = 0) -> NLVRModel:
    torch.manual_seed(seed)
    return NLVRModel(cfg(), head)


def on_disk(model: torch.nn.Module, tmp_path, name: str) -> dict[str, torch.Tensor]:
    """The state as a checkpoint holds it: safetensors keeps one name per tied group."""
    path = tmp_path / f"{name}.safetensors"
    save_model(model, str(path))
    return load_file(str(path))


def load_adapted(model: NLVRModel, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    adapted, allow = NLVRModel.adapt_pretrained(state, model)
    aliases = [n for g in tied_groups(model) if any(n in adapted for n in g) for n in g if n not in adapted]
    load_strict(model, adapted, source="test", allow_missing=[*allow, *aliases])
    if NLVRModel.needs_momentum_copy(adapted):
        model.momentum.copy_from_online()
    return adapted


def inputs(b: int = 2, t: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, 3, 32, 32, generator=g),
        torch.randn(b, 3, 32, 32, generator=g),
        torch.randint(1000, 2000, (b, t), generator=g),
        torch.ones(b, t, dtype=torch.long),
    )


@torch.no_grad()
def perturb(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.add_(torch.randn(p.shape, generator=g) * 0.1)


def test_config_is_doubled_inside_but_saved_original():
    m = nlvr()
    assert len(m.fusion.layer) == 2 * F_LAYERS and m.base_fusion_layers == F_LAYERS
    assert m.cfg.text.fusion_layers == F_LAYERS and m.cfg == cfg()
    assert m.queue is None and m.itm_head is None and m.mlm_head is None and m.vision_proj is None
    assert not any(k.startswith(("queue.", "temp", "text_proj", "vision_proj")) for k in m.state_dict())


@pytest.mark.parametrize("where", ["online", "twin"])
def test_cross_attention_key_value_shared_within_pairs_only(where):
    m = nlvr()
    fusion = m.fusion if where == "online" else m.momentum["fusion"]
    for i in range(F_LAYERS):
        even, odd = fusion.layer[2 * i], fusion.layer[2 * i + 1]
        assert odd.crossattention.self.kv is even.crossattention.self.kv
        assert odd.crossattention.self.query is not even.crossattention.self.query
        assert odd.crossattention.output is not even.crossattention.output
        assert odd.attention is not even.attention and odd.intermediate is not even.intermediate
        assert odd.output is not even.output
        if i + 1 < F_LAYERS:  # not shared across pairs
            assert fusion.layer[2 * i + 2].crossattention.self.kv is not even.crossattention.self.kv
    if where == "twin":  # the twin's tie is its own, not the online module
        assert m.momentum["fusion"].layer[1].crossattention.self.kv is not m.fusion.layer[0].crossattention.self.kv
        assert not m.momentum["fusion"].layer[1].crossattention.self.kv.weight.requires_grad
    # one parameter per tied pair: 2 tensors (the fused K/V weight and bias) x F pairs fewer than the names
    names = len(dict(fusion.named_parameters(remove_duplicate=False)))
    assert names - len(list(fusion.parameters())) == 2 * F_LAYERS


def test_shared_key_value_get_both_layers_gradients_and_twin_follows():
    m = nlvr()
    m.train(False)
    m.classify(*inputs()).sum().backward()
    g = m.fusion.layer[0].crossattention.self.kv.weight.grad
    assert g is not None and g.abs().sum() > 0
    with torch.no_grad():
        m.fusion.layer[1].crossattention.self.kv.weight.add_(1.0)
    m.after_optimizer_step(1)  # EMA over the deduplicated parameter list: tie intact in the twin
    twin = m.momentum["fusion"]
    assert torch.equal(twin.layer[0].crossattention.self.kv.weight, twin.layer[1].crossattention.self.kv.weight)


def test_classify_runs_one_vit_pass_and_alternates_images():
    m = nlvr()
    m.train(False)
    seen = []
    orig = m.vision.forward_features

    def counting(x):
        seen.append(x.shape[0])
        return orig(x)

    m.vision.forward_features = counting
    i0, i1, ids, mask = inputs(b=3)
    logits = m.classify(i0, i1, ids, mask)
    assert seen == [6] and logits.shape == (3, 2)
    # same as projecting each image on its own and fusing with [image0, image1]
    with torch.no_grad():
        t0, t1 = orig(i0), orig(i1)
        h = m.text_states(ids, mask)
        for k, lay in enumerate(m.fusion.layer):
            kv = lay.crossattention.project_kv(t0 if k % 2 == 0 else t1)
            h = lay(h, mask.bool()[:, None, None, :], kv)
        ref = m.cls_head(h[:, 0])
    assert torch.allclose(logits, ref, atol=1e-5)
    assert not torch.allclose(m.classify(i1, i0, ids, mask), logits, atol=1e-4)  # order matters


def test_ta_head_has_no_momentum_and_frozen_vision_proj():
    m = nlvr("ta")
    assert m.momentum_modules() == {} and len(list(m.momentum.parameters())) == 0
    m.after_optimizer_step(1)
    m.momentum.copy_from_online()  # no-ops, no foreach error on empty lists
    assert m.text_proj is None and m.temp is None and m.queue is None
    assert not any(p.requires_grad for p in m.vision_proj.parameters())
    assert m.classify(*inputs()).shape == (2, 3)
    with pytest.raises(ValueError, match="no momentum twin"):
        m.classify(*inputs(), momentum=True)
    with pytest.raises(ValueError, match="head"):
        NLVRModel(cfg(), "itm")


def pretrained_albef() -> ALBEF:
    torch.manual_seed(1)
    a = ALBEF(cfg())
    perturb(a.momentum, 2)  # momentum weights differ from online ones: both mappings are checked
    return a


def assert_expanded(model: NLVRModel, src: ALBEF, momentum: bool) -> None:
    pre = src.momentum["fusion"] if momentum else src.fusion
    fus = model.momentum["fusion"] if momentum else model.fusion
    for n in range(F_LAYERS):
        want = dict(pre.layer[n].named_parameters())
        for i in (2 * n, 2 * n + 1):
            got = dict(fus.layer[i].named_parameters(remove_duplicate=False))
            assert got.keys() == want.keys()
            for k in want:
                assert torch.equal(got[k], want[k]), (i, k)
    for name in ("vision", "text"):
        a = src.momentum[name] if momentum else getattr(src, name)
        b = model.momentum[name] if momentum else getattr(model, name)
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name


def test_expand_pretraining_checkpoint_into_cls_model(tmp_path):
    src = pretrained_albef()
    state = on_disk(src, tmp_path, "pretrain")
    # safetensors kept the MLM decoder name of the tied word embeddings: adapt must recover them
    assert "text.embeddings.word_embeddings.weight" not in state and "mlm_head.decoder.weight" in state
    model = nlvr(seed=5)
    head_before = {k: v.clone() for k, v in model.cls_head.state_dict().items()}
    adapted = load_adapted(model, state)
    assert not NLVRModel.needs_momentum_copy(adapted)
    assert not any(k.startswith(("mlm_head", "itm_head", "text_proj", "queue", "vision_proj", "temp")) for k in adapted)
    assert not any(
        k.startswith("momentum.twin.") and k.split(".")[2] in ("mlm_head", "text_proj", "vision_proj") for k in adapted
    )
    assert_expanded(model, src, momentum=False)
    assert_expanded(model, src, momentum=True)
    assert model.fusion.layer[1].crossattention.self.kv is model.fusion.layer[0].crossattention.self.kv
    # the new head keeps its initialisation, online and twin alike
    assert all(torch.equal(model.cls_head.state_dict()[k], v) for k, v in head_before.items())
    assert all(torch.equal(model.momentum["cls_head"].state_dict()[k], v) for k, v in head_before.items())


def test_expand_pretraining_checkpoint_into_ta_model(tmp_path):
    src = pretrained_albef()
    model = nlvr("ta", seed=5)
    _, allow = NLVRModel.adapt_pretrained(on_disk(src, tmp_path, "pretrain"), model)
    assert allow == ["ta_head.*"]
    adapted = load_adapted(model, on_disk(src, tmp_path, "pretrain"))
    assert not any(k.startswith("momentum.") for k in adapted)
    assert_expanded(model, src, momentum=False)
    assert torch.equal(model.vision_proj.weight, src.vision_proj.weight)


def test_ta_checkpoint_into_cls_model_copies_momentum_after_loading(tmp_path):
    ta = nlvr("ta", seed=3)
    perturb(ta, 4)
    state = on_disk(ta, tmp_path, "ta")
    assert "fusion.layer.1.crossattention.self.kv.weight" not in state  # one name per tied pair
    model = nlvr(seed=5)
    adapted, allow = NLVRModel.adapt_pretrained(state, model)
    assert sorted(allow) == ["cls_head.*", "momentum.twin.*"]
    assert not any(k.startswith(("ta_head", "vision_proj")) for k in adapted)
    assert NLVRModel.needs_momentum_copy(adapted)
    load_adapted(model, state)  # loads, then copies online -> momentum
    online = model.state_dict()
    for k, v in model.momentum["fusion"].state_dict().items():
        assert torch.equal(v, online[f"fusion.{k}"]), k
    for name in ("vision", "text", "fusion", "cls_head"):
        for k, v in model.momentum[name].state_dict().items():
            assert torch.equal(v, model.get_submodule(name).state_dict()[k]), (name, k)
    for k, v in ta.fusion.state_dict().items():
        assert torch.equal(model.fusion.state_dict()[k], v), k
    twin = model.momentum["fusion"]
    assert twin.layer[1].crossattention.self.kv is twin.layer[0].crossattention.self.kv


def test_finetuned_checkpoint_round_trip_is_unchanged(tmp_path):
    src = nlvr(seed=3)
    perturb(src, 4)
    state = on_disk(src, tmp_path, "ft")
    model = nlvr(seed=5)
    adapted, allow = NLVRModel.adapt_pretrained(state, model)
    assert allow == [] and adapted.keys() == state.keys()
    load_adapted(model, state)
    ref = src.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())


def test_mismatched_fusion_depth_is_reported():
    src = ALBEF(narrow_model_config(embed_dim=32, queue_size=8, fusion_layers=3))
    with pytest.raises(ValueError, match="fusion layers"):
        NLVRModel.adapt_pretrained(src.state_dict(), nlvr())
