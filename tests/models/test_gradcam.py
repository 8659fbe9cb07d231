"""Grad-CAM over a fusion layer's cross-attention (vlp.models.gradcam) and the attention capture path
of vlp.models.text.Attention: hand-computed probabilities and gradients, a hand-written map, the
capture path equal to SDPA, and the maps of a tiny ALBEF."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.albef_fakes import tiny_config
from vlp.models.albef import ALBEF, ImageFeatures
from vlp.models.gradcam import capture_cross_attention, default_layer, gradcam, gradcam_maps, token_mean
from vlp.models.text import Attention, FusionEncoder


def test_capture_path_probabilities_and_gradient_by_hand() -> None:
    """One query per head, 5 keys (image [CLS] + 2x2 patches): scores q.k / sqrt(2) chosen as
    log 1, log 2, log 3, log 1, log 1, so the probabilities are [1, 2, 3, 1, 1] / 8; with the last
    key masked, [1, 2, 3, 1, 0] / 7. For S = sum(g * (P @ V)), dS/dP[n] = g . V[n]."""
    att = Attention(hidden=4, heads=2, kv_width=4, dropout=0.0, eps=1e-12, cross=True)
    r2 = math.sqrt(2.0)
    q = torch.tensor([r2, 0.0]).expand(1, 2, 1, 2)  # [B, heads, T, d]: scores = k[:, 0]
    logs = torch.tensor([0.0, math.log(2), math.log(3), 0.0, 0.0])
    k = torch.stack([logs, torch.zeros(5)], dim=-1).expand(1, 2, 5, 2)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0], [0.0, -1.0]]).expand(1, 2, 5, 2)
    g = torch.tensor([3.0, -1.0])

    out = att._attend_explicit(q, k, v, None, None, 0.0)
    expected = torch.tensor([1.0, 2.0, 3.0, 1.0, 1.0]) / 8
    torch.testing.assert_close(att.probs[0, :, 0], expected.expand(2, 5))
    torch.testing.assert_close(out[0, :, 0], torch.tensor([6.0, 4.0]).expand(2, 2) / 8)  # sum_n P[n] V[n]
    (grad,) = torch.autograd.grad((out * g).sum(), att.probs)
    torch.testing.assert_close(grad[0, :, 0], torch.tensor([3.0, -1.0, 2.0, 6.0, 1.0]).expand(2, 5))

    mask = torch.tensor([True, True, True, True, False])[None, None, None, :]
    att._attend_explicit(q, k, v, mask, None, 0.0)
    torch.testing.assert_close(att.probs[0, 0, 0], torch.tensor([1.0, 2.0, 3.0, 1.0, 0.0]) / 7)


def _fusion(layers: int = 2) -> FusionEncoder:
    torch.manual_seed(0)
    return FusionEncoder(hidden=16, layers=layers, heads=2, intermediate=32, image_width=12, dropout=0.1).eval()


@pytest.mark.parametrize("layer", [0, 1])
def test_capture_path_equals_sdpa_with_padding_image_mask_and_groups(layer: int) -> None:
    fusion = _fusion()
    hidden, image = torch.randn(3, 5, 16), torch.randn(2, 7, 12)
    text_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    image_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])
    index = torch.tensor([1, 0, 1])
    for kwargs in ({"image_index": index}, {}):
        img, imask = (image, image_mask) if kwargs else (image[index], image_mask[index])
        reference = fusion(hidden, text_mask, img, imask, **kwargs)
        with capture_cross_attention(fusion, layer) as att:
            captured = fusion(hidden, text_mask, img, imask, **kwargs)
            assert att.probs.shape == (3, 2, 5, 7)
            torch.testing.assert_close(att.probs.sum(-1), torch.ones(3, 2, 5))
            assert float(att.probs.detach()[[0, 2], :, :, 5:].abs().max()) == 0.0  # image 1's masked tokens
        torch.testing.assert_close(captured, reference, rtol=1e-5, atol=1e-6)
    assert not fusion.layer[layer].crossattention.capture and fusion.layer[layer].crossattention.probs is None


def test_default_path_is_untouched_sdpa(monkeypatch) -> None:
    fusion, calls = _fusion(1), []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    fusion(torch.randn(1, 3, 16), torch.ones(1, 3), torch.randn(1, 4, 12))
    assert len(calls) == 2  # self- and cross-attention
    with capture_cross_attention(fusion, 0):
        fusion(torch.randn(1, 3, 16), torch.ones(1, 3), torch.randn(1, 4, 12))
    assert len(calls) == 3  # the captured cross-attention is explicit, self-attention still SDPA
    assert fusion.layer[0].crossattention.probs is None


class _Patch(nn.Module):
    patch_size = (1, 1)


class _Vision(nn.Module):
    num_prefix_tokens = 1

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = _Patch()


class _TinyFused(nn.Module):
    """A model with one fusion layer (2 heads) over 2x2 'images' whose pixels are the patch
    features: image tokens = [CLS feature, 4 patch features]; text states are fixed."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.vision = _Vision()
        self.fusion = FusionEncoder(hidden=4, layers=1, heads=2, intermediate=8, image_width=3, dropout=0.0).eval()
        self.cls = nn.Parameter(torch.randn(3))
        self.embed = nn.Embedding(10, 4)
        self.itm_head = nn.Linear(4, 2)

    def encode_image(self, images: torch.Tensor) -> ImageFeatures:
        patches = images.flatten(2).transpose(1, 2)  # [B, 4, 3]
        return ImageFeatures(torch.cat([self.cls.expand(len(images), 1, 3), patches], dim=1), None)

    def text_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.embed(ids)

    def fuse(self, hidden: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.fusion(hidden, mask, tokens)

    def itm_logits(self, fused: torch.Tensor) -> torch.Tensor:
        return self.itm_head(fused[:, 0])


def _by_hand(model: _TinyFused, images: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The fusion layer written out with the cross-attention probabilities P as a leaf tensor:
    the map is mean_heads(P * max(0, d logit_1 / dP)) over the patches, times the text mask."""
    lay = model.fusion.layer[0]
    x = model.embed(ids)
    tmask = mask.bool()[:, None, None, :]
    x = lay.attention(x, None, tmask)  # self-attention
    ca = lay.crossattention
    k, v = ca.project_kv(model.encode_image(images).tokens)
    q = ca._split(ca.self.query(x))
    P = ((q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])).softmax(-1).detach().requires_grad_()
    a = (P @ v).transpose(1, 2).reshape(x.shape)
    x = ca.output(a, x)
    fused = lay.output(F.gelu(lay.intermediate.dense(x)), x)
    (grad,) = torch.autograd.grad(model.itm_head(fused[:, 0])[:, 1].sum(), P)
    cam = (P[..., 1:] * grad[..., 1:].clamp(min=0)).reshape(len(ids), 2, ids.shape[1], 2, 2)
    return cam.mean(1).detach() * mask[:, :, None, None]


def test_gradcam_map_equals_the_hand_written_cam_times_positive_gradient() -> None:
    model = _TinyFused()
    images = torch.randn(2, 3, 2, 2)
    ids, mask = torch.tensor([[1, 4, 5, 2], [1, 6, 2, 0]]), torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    result = gradcam(model, images, ids, mask)
    assert result.maps.shape == (2, 4, 2, 2) and result.layer == 0
    torch.testing.assert_close(result.maps, _by_hand(model, images, ids, mask))
    assert float(result.maps[1, 3].abs().max()) == 0.0 and float(result.maps.min()) >= 0.0
    assert float(result.maps.sum()) > 0  # the case is not degenerate
    torch.testing.assert_close(
        result.itm_logits,
        model.itm_logits(model.fuse(model.embed(ids), mask, model.encode_image(images).tokens)).detach(),
    )
    assert all(p.grad is None for p in model.parameters())  # autograd.grad: no .grad on parameters


def test_token_mean_albef_and_words_only() -> None:
    maps = torch.arange(2 * 4 * 1 * 1, dtype=torch.float32).reshape(2, 4, 1, 1)  # row 0: 0..3, row 1: 4..7
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    torch.testing.assert_close(token_mean(maps, mask)[:, 0, 0], torch.tensor([1.5, 5.0]))
    torch.testing.assert_close(token_mean(maps, mask, words_only=True)[:, 0, 0], torch.tensor([1.5, 5.0]))
    maps[0, 0], maps[1, 2] = 100.0, 100.0  # [CLS] of row 0, [SEP] of row 1
    torch.testing.assert_close(token_mean(maps, mask, words_only=True)[:, 0, 0], torch.tensor([1.5, 5.0]))
    with pytest.raises(ValueError, match="words_only"):
        token_mean(maps, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]), words_only=True)


def test_default_layer_and_bad_layer() -> None:
    assert [default_layer(n) for n in (1, 2, 3, 6)] == [0, 0, 1, 2]  # ALBEF-base: 2 of 6 (block_num 8)
    model = _TinyFused()
    with pytest.raises(ValueError, match="fusion layers 0..0"):
        gradcam_maps(model, torch.randn(1, 3, 2, 2), torch.tensor([[1, 2]]), torch.ones(1, 2), layer=1)


def test_tiny_albef_maps_are_batch_invariant_and_leave_no_state() -> None:
    torch.manual_seed(0)
    model = ALBEF(tiny_config()).eval()
    images = torch.randn(2, 3, 32, 32)
    ids = torch.tensor([[101, 2417, 4418, 102], [101, 2630, 102, 0]])
    mask = (ids > 0).long()
    with torch.no_grad():  # Grad-CAM turns gradients on by itself
        maps = gradcam_maps(model, images, ids, mask, layer=1)
    assert maps.shape == (2, 4, 4, 4)  # 32 px / patch 8
    alone = gradcam_maps(model, images[1:], ids[1:, :3], mask[1:, :3], layer=1)
    torch.testing.assert_close(maps[1, :3], alone[0], rtol=1e-4, atol=1e-7)
    assert all(not lay.crossattention.capture and lay.crossattention.probs is None for lay in model.fusion.layer)
    # the last fusion layer: only [CLS] reaches the ITM head after it, so only its row has a map
    assert float(maps[:, 1:].abs().max()) == 0.0 and float(maps[:, 0].amax(dim=(-2, -1)).min()) > 0.0
    first = gradcam_maps(model, images, ids, mask, layer=0)
    assert float(first[0, 1:].abs().amax(dim=(-2, -1)).min()) > 0.0  # below it every word has a map
    assert all(p.grad is None for p in model.parameters())
