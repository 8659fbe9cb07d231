import torch

from vlp.config import EvalConfig, ModelConfig, VisionConfig, TextConfig
from vlp.data.formats import RetrievalSplit
from vlp.eval.metrics import retrieval_metrics
from vlp.eval.retrieval import RERANK_OFFSET, Embeddings, evaluate_retrieval
from vlp.models.albef import ALBEF


def setup():
    torch.manual_seed(0)
    model = ALBEF(ModelConfig(
        vision=VisionConfig(depth=1), text=TextConfig(layers=1, fusion_layers=1, dropout=0.0), queue_size=8, embed_dim=16,
    )).eval()
    n_img, per, t = 6, 2, 5
    with torch.no_grad():
        img = model.encode_image(torch.randn(n_img, 3, 64, 64))
        ids = torch.randint(1000, 2000, (n_img * per, t))
        ids[:, 0] = 101
        mask = torch.ones_like(ids)
        mask[::3, 3:] = 0
        txt = model.encode_text(ids, mask)
    emb = Embeddings(img.tokens, img.feat, txt.hidden, mask, txt.feat)
    split = RetrievalSplit([f"{i}.png" for i in range(n_img)], [str(i) for i in range(n_img * per)],
                           [i // per for i in range(n_img * per)], [[per * i, per * i + 1] for i in range(n_img)], "mem")
    return model, emb, split


def brute_itm(model, emb, i, t):
    with torch.no_grad():
        fused = model.fuse(emb.text_hidden[t : t + 1], emb.text_mask[t : t + 1], emb.image_tokens[i : i + 1])
        return model.itm_logits(fused)[0, 1].item()


def test_full_rerank_equals_brute_force_itm_for_every_pair():
    model, emb, split = setup()
    res = evaluate_retrieval(model, emb, split, EvalConfig(k_test=100, score="itm", batch_size=5), show_progress=False)
    for i in range(6):
        for t in range(12):
            ref = brute_itm(model, emb, i, t)
            assert abs(res.scores_i2t[i, t].item() - RERANK_OFFSET - ref) < 1e-3
            assert abs(res.scores_t2i[t, i].item() - RERANK_OFFSET - ref) < 1e-3


def test_topk_rerank_keeps_itc_order_below_and_adds_itc_in_itm_plus_itc():
    model, emb, split = setup()
    sim = emb.image_feat @ emb.text_feat.T
    res = evaluate_retrieval(model, emb, split, EvalConfig(k_test=2, score="itm+itc", batch_size=4), show_progress=False)
    for t in range(12):
        top = sim[:, t].topk(2).indices.tolist()
        for i in range(6):
            got = res.scores_t2i[t, i].item()
            if i in top:
                assert abs(got - RERANK_OFFSET - (brute_itm(model, emb, i, t) + sim[i, t].item())) < 1e-3
            else:
                assert abs(got - sim[i, t].item()) < 1e-6


def test_itc_score_is_plain_cosine():
    model, emb, split = setup()
    res = evaluate_retrieval(model, emb, split, EvalConfig(score="itc"), show_progress=False)
    sim = emb.image_feat @ emb.text_feat.T
    assert torch.allclose(res.scores_i2t, sim)
    assert res.metrics == retrieval_metrics(sim, sim.T, split.img2txt, split.txt2img)
