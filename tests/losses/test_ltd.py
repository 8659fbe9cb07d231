"""LTD: the Lagrange multiplier's dynamics, bounds and exact resume; reconstruction losses (LTD, ITD)."""

import math

import pytest
import torch
import torch.nn.functional as F

from vlp.config import LTDConfig, MultiplierConfig
from vlp.errors import ConfigError
from vlp.losses.ltd import LagrangeMultiplier, constrained, cosine_reconstruction, token_nll, weighted
from vlp.tasks.reconstruction import Reconstruction
from vlp.weights import load_module_states, load_task_state, module_states, save_checkpoint


class Toy(torch.nn.Module):
    """A 'model' w whose reconstruction of target y is w itself; L_con pulls w towards z."""

    def __init__(self, pull: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, 0.0]))
        self.y = torch.tensor([0.0, 1.0])
        self.z = torch.tensor([1.0, 0.0])
        self.pull = pull

    def losses(self):
        return self.pull * cosine_reconstruction(self.w[None], self.z[None]), cosine_reconstruction(
            self.w[None], self.y[None]
        )


def run(toy, lam, opt, steps, eta):
    trace = []
    for _ in range(steps):
        l_con, l_rec = toy.losses()
        constrained(l_con, l_rec, lam.value(), eta).backward()
        opt.step()
        opt.zero_grad()
        lam.step()
        trace.append((l_rec.item(), lam.lam.item(), lam.value().item()))
    return trace


def test_lambda_rises_while_violated_then_returns_to_zero_and_stays_in_bounds():
    torch.manual_seed(0)
    toy, eta = Toy(pull=0.0), 0.2
    lam = LagrangeMultiplier(MultiplierConfig(lr=0.05))
    trace = run(toy, lam, torch.optim.SGD(toy.parameters(), lr=0.002), 400, eta)
    rec = [t[0] for t in trace]
    lams = [t[1] for t in trace]
    first_ok = next(i for i, r in enumerate(rec) if r <= eta)
    assert rec[0] == pytest.approx(1.0) and first_ok > 20
    # while L_rec > eta lambda goes up (each step's gradient L_rec/eta - 1 > 0 feeds the EMA)
    assert all(b > a for a, b in zip(lams[: first_ok - 1], lams[1:first_ok]))
    assert max(lams) > 5.0
    # after the bound is met it comes back down to exactly 0 and stays there (projection)
    assert lams[-1] == 0.0 and all(x == 0.0 for x in lams[-150:])
    assert all(0.0 <= x <= 100.0 for x in lams)
    assert rec[-1] <= eta


def test_lambda_saturates_at_max_when_infeasible_and_straight_through_drifts():
    toy = Toy(pull=0.0)
    toy.w.requires_grad_(False)  # the model cannot reconstruct: L_rec = 1 forever
    cfg = MultiplierConfig(lr=1.0, max=100.0)
    lam = LagrangeMultiplier(cfg)
    for _ in range(40):
        l_con, l_rec = toy.losses()
        (l_con + lam.value() * (l_rec / 0.01 - 1.0)).backward()
        lam.step()
        assert 0.0 <= lam.lam.item() <= 100.0
    assert lam.lam.item() == 100.0
    # the reference's straight-through clamp: the parameter leaves [0, max], the value used does not
    st = LagrangeMultiplier(MultiplierConfig(lr=1.0, max=100.0, straight_through=True))
    for _ in range(40):
        (st.value() * (1.0 / 0.01 - 1.0)).backward()
        st.step()
    assert st.lam.item() > 1000.0 and st.value().item() == 100.0


def test_multiplier_update_is_sgd_ascent_with_momentum_and_dampening():
    cfg = MultiplierConfig(init=1.0, lr=0.1, momentum=0.9, dampening=0.9)
    lam = LagrangeMultiplier(cfg)
    ref = torch.nn.Parameter(torch.tensor([1.0]))
    sgd = torch.optim.SGD([ref], lr=0.1, momentum=0.9, dampening=0.9, maximize=True)
    for g in [3.0, -1.0, 0.5, 2.0]:
        lam.lam.grad = torch.tensor([g])
        ref.grad = torch.tensor([g])
        lam.step()
        sgd.step()
        assert lam.lam.item() == pytest.approx(ref.item(), abs=1e-7)
    assert lam.lam.grad is None
    # the gradient lambda receives is L_rec / eta - 1
    lam2 = LagrangeMultiplier(cfg)
    constrained(torch.tensor(0.0), torch.tensor(0.3), lam2.value(), 0.2).backward()
    assert lam2.lam.grad.item() == pytest.approx(0.5)


def test_multiplier_resumes_exactly_from_a_checkpoint(tmp_path):
    eta = 0.2
    cfg = LTDConfig(
        mode="constraint", decoder="latent", eta=eta, targets="unused", hidden=8, multiplier=MultiplierConfig(lr=0.05)
    )

    def make():
        torch.manual_seed(0)
        toy = Toy(pull=0.3)
        rec = Reconstruction(cfg, 2, 2, 10)
        return toy, rec, torch.optim.SGD([*toy.parameters(), *rec.decoder.parameters()], lr=0.05)

    def steps(toy, rec, opt, n):
        out = []
        for _ in range(n):
            l_con, _ = toy.losses()
            loss, stats = rec(l_con, toy.w[None], {"ltd_target": toy.y[None]})
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.after_optimizer_step()
            out.append(stats["ltd_lambda"].item())
        return out

    toy, rec, opt = make()
    full = steps(toy, rec, opt, 30)
    toy, rec, opt = make()
    first = steps(toy, rec, opt, 12)
    ckpt = save_checkpoint(tmp_path / "step_12", toy, {"step": 12}, module_states(reconstruction=rec))
    assert set(load_task_state(ckpt)) >= {
        "reconstruction.multiplier.lam",
        "reconstruction.multiplier.momentum_buffer",
        "reconstruction.multiplier.steps",
        "reconstruction.decoder.net.0.weight",
    }
    toy2, rec2, opt2 = make()  # fresh objects: lambda back at 1, empty momentum
    toy2.load_state_dict(toy.state_dict())
    load_module_states(load_task_state(ckpt), reconstruction=rec2)
    assert rec2.multiplier.momentum_buffer.item() == rec.multiplier.momentum_buffer.item() != 0.0
    rest = steps(toy2, rec2, opt2, 18)
    assert first + rest == full  # bit-exact trajectory


def test_eta_must_be_positive():
    with pytest.raises(ConfigError, match="loss.ltd.eta"):
        LTDConfig(eta=0.0)
    with pytest.raises(ValueError):
        constrained(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0), 0.0)


def test_reconstruction_losses_and_objectives():
    pred = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    target = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    # cos = 1/sqrt(2) and 1
    assert cosine_reconstruction(pred, target).item() == pytest.approx((1 - 1 / math.sqrt(2)) / 2)
    l_con, l_rec, lam = torch.tensor(2.0), torch.tensor(0.3), torch.tensor(4.0)
    assert constrained(l_con, l_rec, lam, 0.2).item() == pytest.approx(2.0 + 4.0 * 0.5)
    assert weighted(l_con, l_rec, 0.5).item() == pytest.approx(2.15)


def test_itd_token_nll_is_normalised_over_the_vocabulary_and_ignores_padding():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=g, requires_grad=True)
    targets = torch.randint(0, 7, (2, 4), generator=g)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    loss = token_nll(logits, targets, mask)
    ref = (
        sum(F.cross_entropy(logits[b, t][None], targets[b, t][None]) for b in range(2) for t in range(4) if mask[b, t])
        / 2
    )
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    # a proper likelihood: adding a per-position constant over the vocabulary changes nothing
    shifted = logits + torch.randn(2, 4, 1, generator=g)
    assert token_nll(shifted, targets, mask).item() == pytest.approx(loss.item(), abs=1e-5)
    # padded positions do not matter
    poked = logits.detach().clone()
    poked[0, 3] += 100.0
    poked[1, 2:] -= 50.0
    assert token_nll(poked, targets, mask).item() == pytest.approx(loss.item(), abs=1e-5)
    # the reference bug normalises over time instead: it is not invariant to the same shift
    bug = token_nll(logits, targets, mask, time_axis_bug=True)
    assert bug.item() != pytest.approx(loss.item(), abs=1e-3)
    assert token_nll(shifted, targets, mask, time_axis_bug=True).item() != pytest.approx(bug.item(), abs=1e-3)


def test_itd_decoder_reconstructs_tokens_with_teacher_forcing():
    cfg = LTDConfig(mode="dual", decoder="tokens", itd_word_dim=6, beta=2.0)
    rec = Reconstruction(cfg, embed_dim=4, target_dim=None, vocab_size=11)
    emb = F.normalize(torch.randn(3, 4), dim=-1)
    ids = torch.tensor([[1, 5, 6, 2, 0], [1, 7, 2, 0, 0], [1, 3, 4, 8, 2]])
    mask = (ids != 0).long()
    loss, stats = rec(torch.tensor(1.0), emb, {"input_ids": ids, "attention_mask": mask})
    logits = rec.decoder(emb, ids)
    assert logits.shape == (3, 4, 11)
    expected = token_nll(logits, ids[:, 1:], mask[:, 1:])
    assert stats["ltd_rec"].item() == pytest.approx(expected.item(), abs=1e-5)
    assert loss.item() == pytest.approx(1.0 + 2.0 * expected.item(), abs=1e-4)
    assert "ltd_lambda" not in stats and rec.multiplier is None
    # the first prediction depends on the caption embedding (GRU initial state)
    other = rec.decoder(F.normalize(torch.randn(3, 4), dim=-1), ids)
    assert not torch.allclose(other[:, 0], logits[:, 0])
