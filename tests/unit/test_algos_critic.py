"""GAE, masked whitening and the clipped value loss, checked against per-row Python loop references."""

import math
import statistics

import pytest
import torch

from mmrl.algos.masked import masked_mean, masked_whiten
from mmrl.algos.ppo import gae_advantages
from mmrl.algos.value_loss import value_loss

R = 7
LENGTHS = [1, 3, R, 5, 2]


def ragged_mask(lengths: list[int], width: int = R) -> torch.Tensor:
    return torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])


def random_inputs(seed: int, lengths: list[int] = LENGTHS) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    shape = (len(lengths), R)
    rewards = torch.randn(shape, generator=gen, dtype=torch.float64)
    values = torch.randn(shape, generator=gen, dtype=torch.float64)
    return rewards, values, ragged_mask(lengths).double()


def noise(like: torch.Tensor, seed: int) -> torch.Tensor:
    return torch.randn(like.shape, generator=torch.Generator().manual_seed(seed), dtype=like.dtype)


def whiten_reference(xs: list[float]) -> list[float]:
    """Whitening with the sample mean and unbiased (n - 1) standard deviation."""
    mean, std = statistics.mean(xs), statistics.stdev(xs)
    return [(x - mean) / math.sqrt(std**2 + 1e-8) for x in xs]


def gae_reference(rewards, values, mask, gamma, lam):
    """Plain per-row, per-token GAE; returns nested lists (raw advantages, returns), 0.0 on padding."""
    raw_adv, returns = [], []
    for b in range(rewards.shape[0]):
        n = int(mask[b].sum())
        r = [float(x) for x in rewards[b, :n]]
        v = [float(x) for x in values[b, :n]]
        adv = [0.0] * R
        running = 0.0
        for t in range(n - 1, -1, -1):
            v_next = v[t + 1] if t + 1 < n else 0.0
            running = r[t] + gamma * v_next - v[t] + gamma * lam * running
            adv[t] = running
        raw_adv.append(adv)
        returns.append([adv[t] + v[t] if t < n else 0.0 for t in range(R)])
    return raw_adv, returns


def test_gae_by_hand_gamma_lam_one():
    rewards = torch.tensor([[0.0, 1.0, 5.0], [1.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.2, 9.0], [1.0, 2.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    # row 0 (last token is padding, its 5.0 / 9.0 are ignored):
    #   t=1: delta = 1 + 0 - 0.2 = 0.8            -> A1 = 0.8
    #   t=0: delta = 0 + 0.2 - 0.5 = -0.3         -> A0 = -0.3 + 0.8 = 0.5
    #   returns = A + V = [1.0, 1.0]
    # row 1:
    #   t=2: delta = 2 + 0 - 1 = 1                -> A2 = 1
    #   t=1: delta = 0 + 1 - 2 = -1               -> A1 = -1 + 1 = 0
    #   t=0: delta = 1 + 2 - 1 = 2                -> A0 = 2 + 0 = 2
    #   returns = [3, 2, 2]
    assert ret.tolist() == [pytest.approx([1.0, 1.0, 0.0]), pytest.approx([3.0, 2.0, 2.0])]
    # whitening over the 5 valid raw advantages [0.5, 0.8, 2, 0, 1]: mean 4.3 / 5 = 0.86,
    # squared deviations .1296 + .0036 + 1.2996 + .7396 + .0196 = 2.192, unbiased var 2.192 / 4 = 0.548
    std = math.sqrt(0.548)
    expected = [[-0.36 / std, -0.06 / std, 0.0], [1.14 / std, -0.86 / std, 0.14 / std]]
    assert adv.tolist() == [pytest.approx(expected[0], abs=1e-5), pytest.approx(expected[1], abs=1e-5)]


def test_gae_by_hand_discounted():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.4, 0.2, 0.6]])
    mask = torch.ones(1, 3)
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5)
    # t=2: delta = 1 + 0 - 0.6 = 0.4                       -> A2 = 0.4
    # t=1: delta = 0 + 0.5 * 0.6 - 0.2 = 0.1               -> A1 = 0.1 + 0.25 * 0.4 = 0.2
    # t=0: delta = 0 + 0.5 * 0.2 - 0.4 = -0.3              -> A0 = -0.3 + 0.25 * 0.2 = -0.25
    # returns = A + V = [0.15, 0.4, 1.0]
    assert ret[0].tolist() == pytest.approx([0.15, 0.4, 1.0], abs=1e-6)
    assert adv[0].tolist() == pytest.approx(whiten_reference([-0.25, 0.2, 0.4]), abs=1e-5)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.7, 0.3), (0.5, 0.0)])
def test_gae_matches_loop_reference(gamma, lam):
    rewards, values, mask = random_inputs(seed=int(gamma * 100 + lam * 10))
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    raw_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam)
    valid = [(b, t) for b in range(len(LENGTHS)) for t in range(LENGTHS[b])]
    ref_white = dict(zip(valid, whiten_reference([raw_adv[b][t] for b, t in valid])))
    for b in range(len(LENGTHS)):
        assert ret[b].tolist() == pytest.approx(ref_ret[b], abs=1e-9)
        assert adv[b].tolist() == pytest.approx([ref_white.get((b, t), 0.0) for t in range(R)], abs=1e-7)
    assert not adv.requires_grad and not ret.requires_grad


def test_gae_padding_is_zero_and_does_not_leak():
    rewards, values, mask = random_inputs(seed=3)
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    pad = mask == 0
    assert pad.any()
    assert (adv[pad] == 0).all() and (ret[pad] == 0).all()
    junk = noise(rewards, seed=9) * 100
    adv2, ret2 = gae_advantages(
        torch.where(pad, junk, rewards), torch.where(pad, -junk, values), mask, gamma=0.9, lam=0.8
    )
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)


def test_gae_returns_are_reward_to_go_with_zero_values():
    rewards, _, mask = random_inputs(seed=5)
    _, ret = gae_advantages(rewards, torch.zeros_like(rewards), mask, gamma=1.0, lam=1.0)
    for b, n in enumerate(LENGTHS):
        row = [float(x) for x in rewards[b, :n]]
        expected = [sum(row[t:]) for t in range(n)] + [0.0] * (R - n)
        assert ret[b].tolist() == pytest.approx(expected, abs=1e-9)


def test_masked_mean_and_whiten_against_loop_reference():
    rewards, _, mask = random_inputs(seed=11)
    valid = [float(rewards[b, t]) for b, n in enumerate(LENGTHS) for t in range(n)]
    assert float(masked_mean(rewards, mask)) == pytest.approx(statistics.mean(valid), abs=1e-12)
    white = masked_whiten(rewards, mask)
    ref = iter(whiten_reference(valid))
    for b, n in enumerate(LENGTHS):
        assert white[b].tolist() == pytest.approx([next(ref) for _ in range(n)] + [0.0] * (R - n), abs=1e-9)
    # padding values do not enter the statistics
    assert torch.equal(masked_whiten(torch.where(mask == 0, 1e3, rewards), mask), white)
    # without the shift, the valid entries keep their mean (only the scale changes)
    unshifted = masked_whiten(rewards, mask, shift_mean=False)
    mean, std = statistics.mean(valid), statistics.stdev(valid)
    ref = iter([(x - mean) / math.sqrt(std**2 + 1e-8) + mean for x in valid])
    for b, n in enumerate(LENGTHS):
        expected = [next(ref) for _ in range(n)] + [0.0] * (R - n)
        assert unshifted[b].tolist() == pytest.approx(expected, abs=1e-9)


def value_loss_reference(values, old_values, returns, mask, clip_range, mode):
    per_seq, total, count = [], 0.0, 0
    for b in range(values.shape[0]):
        terms = []
        for t in range(values.shape[1]):
            if mask[b, t] == 0:
                continue
            v, old, ret = float(values[b, t]), float(old_values[b, t]), float(returns[b, t])
            v_clip = old + min(max(v - old, -clip_range), clip_range)
            terms.append(0.5 * max((v - ret) ** 2, (v_clip - ret) ** 2))
        total += sum(terms)
        count += len(terms)
        per_seq.append(sum(terms) if mode == "seq-mean-token-sum" else sum(terms) / max(len(terms), 1))
    return total / count if mode == "token-mean" else sum(per_seq) / len(per_seq)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_value_loss_matches_loop_reference(mode):
    returns, old_values, mask = random_inputs(seed=21)
    values = old_values + 0.4 * noise(old_values, seed=2)
    loss, metrics = value_loss(values, old_values, returns, mask, clip_range=0.2, agg_mode=mode)
    expected = value_loss_reference(values, old_values, returns, mask, 0.2, mode)
    assert float(loss) == pytest.approx(expected, rel=1e-9)
    valid = [float(values[b, t]) for b, n in enumerate(LENGTHS) for t in range(n)]
    assert metrics["vpred_mean"] == pytest.approx(statistics.mean(valid), rel=1e-9)


def test_value_loss_clipfrac_by_hand():
    old = torch.zeros(1, 5)
    returns = torch.tensor([[1.0, 1.0, -1.0, 0.0, 7.0]])
    values = torch.tensor([[0.5, 2.0, 0.1, 0.5, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, metrics = value_loss(values, old, returns, mask, clip_range=0.2)
    # t0: v 0.5, clipped 0.2 -> (0.5-1)^2 = .25 < (0.2-1)^2 = .64         clipped larger
    # t1: v 2.0, clipped 0.2 -> (2-1)^2 = 1 > (0.2-1)^2 = .64              unclipped larger
    # t2: v 0.1 within range -> both (1.1)^2 = 1.21                       equal, not counted
    # t3: v 0.5, clipped 0.2 -> (0.5)^2 = .25 > (0.2)^2 = .04              unclipped larger
    # t4: padding (would be clipped larger) -> ignored
    assert metrics["vf_clipfrac"] == pytest.approx(1 / 4)
    assert metrics["vpred_mean"] == pytest.approx((0.5 + 2.0 + 0.1 + 0.5) / 4)
    assert float(loss) == pytest.approx(0.5 * (0.64 + 1.0 + 1.21 + 0.25) / 4)


def test_value_loss_gradient_only_to_values_and_not_on_padding():
    returns, old_values, mask = random_inputs(seed=31)
    values = (old_values + 0.3).requires_grad_()
    old_values.requires_grad_()
    returns.requires_grad_()
    loss, _ = value_loss(values, old_values, returns, mask, clip_range=0.5)
    loss.backward()
    assert old_values.grad is None and returns.grad is None
    assert (values.grad[mask == 0] == 0).all()
    assert (values.grad[mask == 1] != 0).all()
    # values outside the clip range whose clipped term wins carry no gradient
    far = (old_values.detach() + 5.0).requires_grad_()
    loss_far, metrics = value_loss(far, old_values, old_values.detach() + 10.0, mask, clip_range=0.5)
    loss_far.backward()
    assert metrics["vf_clipfrac"] == 1.0 and (far.grad == 0).all()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_value_loss_denominator_splits_add_up(mode):
    returns, old_values, mask = random_inputs(seed=41, lengths=[1, 3, R, 5, 2, 6])
    values = old_values + 0.3 * noise(old_values, seed=4)
    whole, _ = value_loss(values, old_values, returns, mask, clip_range=0.2, agg_mode=mode)
    denom = float(mask.sum()) if mode == "token-mean" else float(mask.shape[0])
    parts = (slice(0, 2), slice(2, None))

    def loss_of(s: slice, denominator: float | None) -> float:
        args = (values[s], old_values[s], returns[s], mask[s])
        return float(value_loss(*args, clip_range=0.2, agg_mode=mode, denominator=denominator)[0])

    halves = [loss_of(s, denom) for s in parts]
    assert halves[0] + halves[1] == pytest.approx(float(whole), rel=1e-12)
    # without the global denominator the halves are local means, which do not add up to the whole
    local = [loss_of(s, None) for s in parts]
    assert local[0] + local[1] != pytest.approx(float(whole), rel=1e-3)
