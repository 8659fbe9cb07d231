"""Single-process checks of the global-batch objectives (``loss.itm_negatives``/``loss.mlm_masking``
= global, ``data.text_padding``); the two-process run is in tests/train/test_distributed.py."""

from __future__ import annotations

import pytest
import torch

from vlp.config import DataConfig, FinetuneDataConfig, LossConfig, ModelConfig, TextConfig, VisionConfig
from vlp.data.datasets import Collator
from vlp.errors import ConfigError
from vlp.losses.matching import itm_loss
from vlp.losses.mlm import mask_tokens, mlm_loss
from vlp.models.albef import ALBEF
from vlp.preprocess.transforms import load_tokenizer, tokenize
from vlp.tasks import pretrain as pretrain_module
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask

TOKENS = TokenInfo(30522, 103, (0, 101, 102))
CAPTIONS = [
    "a red circle",
    "two small blue squares on the left of a big green triangle",
    "a shape",
    "one yellow triangle above a circle",
    "a big square",
    "three circles",
]
MAX_LEN = 20


def tiny(dropout: float = 0.1) -> ALBEF:
    torch.manual_seed(0)  # also the dropout masks' generator
    text = TextConfig(layers=1, fusion_layers=1, dropout=dropout)
    return ALBEF(ModelConfig(vision=VisionConfig(depth=1, img_size=32), text=text, queue_size=4, embed_dim=8))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TextConfig())


def batch(tokenizer, padding: str, image_ids=(0, 1, 2, 2, 3, 4)) -> dict[str, torch.Tensor]:
    b = tokenize(tokenizer, CAPTIONS, MAX_LEN, padding)
    b["images"] = torch.randn(len(CAPTIONS), 3, 32, 32, generator=torch.Generator().manual_seed(3))
    b["image_ids"] = torch.tensor(image_ids)
    return b


def step(
    loss: LossConfig, data: dict[str, torch.Tensor], padding: str = "longest", steps: int = 2, dropout: float = 0.1
):
    """Losses of ``steps`` task steps (the queue fills in between) and the gradients of the last."""
    model = tiny(dropout)
    task = PretrainTask(model, loss, TOKENS, seed=5, max_len=MAX_LEN, text_padding=padding)
    losses = []
    for s in range(steps):
        model.zero_grad()
        out = task(data, step=s)
        out["loss"].backward()
        losses.append({k: float(out[k]) for k in ("itc", "itm", "mlm", "loss")})
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return losses, grads


def assert_same(a, b, atol: float = 1e-6) -> None:
    (la, ga), (lb, gb) = a, b
    for x, y in zip(la, lb):
        for k in x:
            assert y[k] == pytest.approx(x[k], abs=atol, rel=atol), (k, x, y)
    assert ga.keys() == gb.keys() and len(ga) > 50
    for n, g in ga.items():
        assert torch.allclose(gb[n], g, atol=atol, rtol=1e-4), n


def test_tokenize_and_collator_pad_to_max_len(tokenizer) -> None:
    longest, fixed = tokenize(tokenizer, CAPTIONS[:3], MAX_LEN), tokenize(tokenizer, CAPTIONS[:3], MAX_LEN, "max_len")
    t = longest["input_ids"].shape[1]
    assert t < MAX_LEN and fixed["input_ids"].shape == fixed["attention_mask"].shape == (3, MAX_LEN)
    assert torch.equal(fixed["input_ids"][:, :t], longest["input_ids"])
    assert torch.equal(fixed["attention_mask"][:, :t], longest["attention_mask"])
    assert not fixed["attention_mask"][:, t:].any()
    items = [{"image": torch.zeros(3, 4, 4), "caption": c, "image_id": i} for i, c in enumerate(CAPTIONS[:2])]
    assert Collator(tokenizer, MAX_LEN, "max_len")(items)["input_ids"].shape == (2, MAX_LEN)
    with pytest.raises(ValueError, match="padding"):
        tokenize(tokenizer, CAPTIONS, MAX_LEN, "fixed")


def test_config_keys_are_validated() -> None:
    for make, key in (
        (lambda: DataConfig(text_padding="fixed"), "data.text_padding"),
        (lambda: FinetuneDataConfig(text_padding="x"), "data.text_padding"),
        (lambda: LossConfig(itm_negatives="all"), "loss.itm_negatives"),
        (lambda: LossConfig(mlm_masking="all"), "loss.mlm_masking"),
    ):
        with pytest.raises(ConfigError, match=key):
            make()


def test_mask_tokens_do_not_depend_on_padding_given_the_length(tokenizer) -> None:
    short, fixed = tokenize(tokenizer, CAPTIONS, MAX_LEN), tokenize(tokenizer, CAPTIONS, MAX_LEN, "max_len")
    t = short["input_ids"].shape[1]

    def draw(b):
        return mask_tokens(
            b["input_ids"],
            b["attention_mask"],
            TOKENS.special_ids,
            TOKENS.mask_id,
            TOKENS.vocab_size,
            0.5,
            torch.Generator().manual_seed(0),
            MAX_LEN,
        )

    (m_s, l_s), (m_f, l_f) = draw(short), draw(fixed)
    assert (l_s != -100).sum() > 5
    assert torch.equal(m_f[:, :t], m_s) and torch.equal(l_f[:, :t], l_s) and (l_f[:, t:] == -100).all()
    with pytest.raises(ValueError, match="length"):
        mask_tokens(fixed["input_ids"], fixed["attention_mask"], TOKENS.special_ids, TOKENS.mask_id, 10, 0.5, None, 4)


def test_losses_normalised_by_a_given_total_are_sums_over_it() -> None:
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(6, 2, generator=g), torch.tensor([1, 0, 0, 1, 0, 0])
    valid = torch.tensor([True, True, False, True, True, True])
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    assert itm_loss(logits, labels, valid).item() == pytest.approx(ce[valid].mean().item(), abs=1e-6)
    assert itm_loss(logits, labels, valid, torch.tensor(2.5)).item() == pytest.approx(ce[valid].sum().item() / 2.5)
    logits, mom, labels = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g), torch.tensor([0, 3, 6, 2])
    mean = mlm_loss(logits, labels, mom, 0.4)
    assert mlm_loss(logits, labels, mom, 0.4, torch.tensor(8.0)).item() == pytest.approx(mean.item() * 4 / 8)
    assert mlm_loss(logits[:0], labels[:0], None, 0.0, torch.tensor(3.0)).item() == 0.0


def test_global_modes_on_one_process_equal_the_local_ones(tokenizer) -> None:
    data = batch(tokenizer, "longest")  # image 2 has two captions: same-image exclusion matters
    local = LossConfig(alpha_ramp_steps=1, mlm_probability=0.4)  # every step masks some of the 6 short captions
    global_ = LossConfig(
        alpha_ramp_steps=1, mlm_probability=0.4, itc_bank="global", itm_negatives="global", mlm_masking="global"
    )
    a, b = step(local, data), step(global_, data)
    assert all(r["itm"] > 0 and r["mlm"] > 0 for r in a[0])
    assert_same(a, b)


def test_padding_to_max_len_gives_the_losses_and_gradients_of_longest_padding(tokenizer) -> None:
    # Padding is masked out everywhere and the MLM masks are drawn for [B, max_len] either way.
    # Dropout is off: its masks are drawn for [B, T, H], so they differ with T (same distribution).
    for cfg in (
        LossConfig(alpha_ramp_steps=1),
        LossConfig(alpha_ramp_steps=1, itm_negatives="global", mlm_masking="global"),
    ):
        longest = step(cfg, batch(tokenizer, "longest"), dropout=0.0)
        assert_same(longest, step(cfg, batch(tokenizer, "max_len"), "max_len", dropout=0.0), 1e-5)


def test_global_modes_across_processes_refuse_per_batch_padding(tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(pretrain_module, "world_size", lambda: 2)
    task = PretrainTask(tiny(), LossConfig(itm_negatives="global"), TOKENS, max_len=MAX_LEN)
    with pytest.raises(ConfigError, match="'loss.itm_negatives'.*'data.text_padding'.*max_len"):
        task(batch(tokenizer, "longest"))
    task = PretrainTask(tiny(), LossConfig(mlm_masking="global"), TOKENS, max_len=MAX_LEN)
    with pytest.raises(ConfigError, match="'loss.mlm_masking'.*'data.text_padding'"):
        task(batch(tokenizer, "longest"))


def test_task_draws_depend_only_on_seed_rank_and_step() -> None:
    """A resumed run draws what an uninterrupted one draws (no generator state is checkpointed)."""
    dev = torch.device("cpu")
    run, resumed = (
        PretrainTask(tiny(), LossConfig(), TOKENS, seed=3),
        PretrainTask(tiny(), LossConfig(), TOKENS, seed=3),
    )
    for s in range(3):
        first = torch.rand(4, generator=run.generator(dev, s))
        again = torch.rand(4, generator=run.generator(dev, s))  # a second micro-batch continues the stream
        assert not torch.equal(first, again)
    assert torch.equal(torch.rand(4, generator=resumed.generator(dev, 2)), first)
    assert torch.equal(
        torch.rand(4, generator=resumed.shared_generator(dev, 7)), torch.rand(4, generator=run.generator(dev, 7))
    )  # rank 0: the shared stream
    assert not torch.equal(
        torch.rand(4, generator=run.generator(dev, 8)),
        torch.rand(4, generator=PretrainTask(tiny(), LossConfig(), TOKENS, seed=4).generator(dev, 8)),
    )
