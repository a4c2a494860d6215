"""PPO mini-batches and epochs, the proximal policy and rollout correction (TIS/MIS) of one RL step."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer
from forge_core.training import Trainer, TrainerConfig
from forge_core.training.batching import collate
from forge_core.training.correction import RolloutCorrection, correct_rollout
from forge_core.training.logprobs import sequence_logprobs
from forge_core.training.update import mini_batch_rows, select_rows, update_policy
from tests.unit.custom_loss_example import ScaledReinforceLoss
from tests.unit.test_trainer import make_batch


def fresh(loss="grpo", dtype=torch.float32, **settings) -> tuple[Trainer, object]:
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    model = model.to(dtype)
    loss = get_loss(loss) if isinstance(loss, str) else loss
    options = {k: settings.pop(k) for k in ("total_steps", "temperature", "compute_dtype") if k in settings}
    return Trainer(model, loss, TrainerConfig(**settings), tok.pad_token_id, **options), tok


def params(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def response_logprobs_by_hand(model, inputs, mask, pad_id) -> torch.Tensor:
    """log π of each response token [B, T] from one plain forward of `model` (gradients kept)."""
    batch = collate(inputs, mask, pad_id)
    logp = torch.log_softmax(model(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits, -1)
    before = (batch.positions - 1).clamp(min=0)  # position t - 1 predicts the token at t
    picked = logp.gather(1, before[..., None].expand(-1, -1, logp.shape[-1]))
    return picked.gather(-1, batch.tokens.gather(1, batch.positions)[..., None]).squeeze(-1)


def test_one_on_policy_step_clips_against_the_trainer_not_the_generator():
    """One mini-batch, one epoch, fresh rollouts: the proximal policy is the trainer's weights of now, so the ratio
    is π/sg(π) (value 1, gradient ∇log π), not π/μ_generator. DAPO's loss and gradient by hand at float64:
    -Σ_i A_i n_i / N and -Σ_i A_i Σ_t ∇log π(y_it) / N; the generator's logprobs feed only the mismatch metrics."""
    trainer, tok = fresh("dapo", dtype=torch.float64, lr=1e-3, max_norm=0.0)
    inputs, targets = make_batch(tok)
    mask, adv, behaviour = targets["padding_mask"], targets["advantages"].double(), targets["old_logprobs"].double()
    hand = copy.deepcopy(trainer.model)
    lp = response_logprobs_by_hand(hand, inputs, mask, tok.pad_token_id)
    n = mask.sum()
    (-(adv[:, None] * torch.where(mask, lp, 0.0)).sum() / n).backward()
    grads = []
    trainer.optimizer.register_step_pre_hook(
        lambda *_: grads.extend(p.grad.clone() for p in trainer.model.parameters()))
    metrics = update_policy(trainer, inputs, targets, seed=3)
    assert len(grads) == len(list(hand.parameters()))
    for got, (name, p) in zip(grads, hand.named_parameters(), strict=True):
        # float64 all through, but the fused head sums its weight's gradient in float32 (the tied embedding: ~1e-8)
        torch.testing.assert_close(got, p.grad, rtol=1e-6, atol=1e-7, msg=name)
    assert metrics["loss"] == pytest.approx(-(adv * mask.sum(-1)).sum().item() / n.item(), rel=1e-12)
    assert metrics["optimizer_steps"] == 1.0 and metrics["ratio_max"] == 1.0 and metrics["ratio_min"] == 1.0
    # the behaviour logprobs of make_batch are made up, far from the trainer's: the k3 mismatch by hand
    delta = (lp.detach() - behaviour)[mask]
    assert metrics["rollout/behaviour_kl_k3"] == pytest.approx((delta.exp() - 1 - delta).mean().item(), rel=1e-9)
    assert metrics["rollout/behaviour_logprob_diff_max"] == pytest.approx(delta.abs().max().item(), rel=1e-9)


def test_k_mini_batches_are_k_sequential_optimizer_steps_against_the_proximal_policy():
    auto, tok = fresh("dapo", lr=1e-3, mini_batches=3)
    hand, _ = fresh("dapo", lr=1e-3)
    inputs, targets = make_batch(tok)
    metrics = update_policy(auto, inputs, targets, seed=11)
    proximal = hand.proximal_logprobs(inputs, targets["padding_mask"])  # before any step: the start weights
    by_hand = {**targets, "old_logprobs": proximal}
    losses = []
    for rows in mini_batch_rows(len(inputs), 3, 11):
        hand.train_step(*select_rows(inputs, by_hand, rows))  # DAPO's token-mean over this mini-batch's tokens
        losses.append(hand.metrics["loss"])
    for p, q in zip(params(auto), params(hand), strict=True):
        assert torch.equal(p, q)
    assert metrics["optimizer_steps"] == 3.0 and auto.step == 3
    assert metrics["loss"] == pytest.approx(sum(losses) / 3)
    assert metrics["grad_norm_max"] >= metrics["grad_norm"]


def test_mini_batches_are_a_seeded_shuffle_of_every_row_once():
    a, b = mini_batch_rows(10, 4, 5), mini_batch_rows(10, 4, 5)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert sorted(torch.cat(a).tolist()) == list(range(10)) and len(a) == 4
    assert [x.tolist() for x in mini_batch_rows(10, 4, 6)] != [x.tolist() for x in a]
    assert len(mini_batch_rows(3, 8, 0)) == 3  # never an empty mini-batch


def test_proximal_logprobs_are_the_log_softmax_of_the_start_weights_at_float64():
    trainer, tok = fresh(dtype=torch.float64, micro_batch_size=2)
    inputs, targets = make_batch(tok)
    mask = targets["padding_mask"]
    got = trainer.proximal_logprobs(inputs, mask)
    batch = collate(inputs, mask, tok.pad_token_id)
    with torch.no_grad():
        logits = trainer.model(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits.double()
    logp = torch.log_softmax(logits, -1)
    for i in range(len(inputs)):
        for t in range(int(mask[i].sum())):
            pos = int(batch.positions[i, t])
            want = logp[i, pos - 1, batch.tokens[i, pos]].item()
            assert got[i, t].item() == pytest.approx(want, abs=1e-10)
    assert got.dtype == torch.float64 and not got.requires_grad
    assert (got[~mask] == 0).all()


def test_tis_and_mis_weights_by_hand_at_float64():
    mask = torch.tensor([[True, True, True], [True, True, False]])
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    proximal = torch.tensor([[-0.2, -2.5, -0.5], [-1.5, -1.0, 9.0]], dtype=torch.float64)  # padding garbage
    w = [[math.exp(0.8), math.exp(-0.5), 1.0], [math.exp(-0.5), 1.0]]
    tis = correct_rollout(proximal, behaviour, mask, RolloutCorrection("tis", "token", 2.0))
    assert tis.token_weights[0].tolist() == pytest.approx([2.0, w[0][1], 1.0])  # e^0.8 = 2.23 truncated at 2
    assert tis.token_weights[1, :2].tolist() == pytest.approx(w[1])
    assert tis.metrics["rollout/is_truncated_frac"] == pytest.approx(1 / 5)
    assert tis.metrics["rollout/is_weight_max"] == pytest.approx(math.exp(0.8))
    assert tis.metrics["rollout/behaviour_logprob_diff_max"] == pytest.approx(0.8)
    deltas = [0.8, -0.5, 0.0, -0.5, 0.0]
    k3 = sum(math.exp(d) - 1 - d for d in deltas) / 5
    assert tis.metrics["rollout/behaviour_kl_k3"] == pytest.approx(k3)

    rejection = correct_rollout(proximal, behaviour, mask, RolloutCorrection("rejection", "token", 2.0))
    assert rejection.token_weights is None
    assert rejection.mask.tolist() == [[False, True, True], [True, True, False]]  # 2.23 > 2 dropped, 0.61 ≥ 0.5 kept
    assert rejection.metrics["rollout/is_masked_frac"] == pytest.approx(1 / 5)
    # MIS: the same mask, and the kept tokens keep their importance weight (0 where masked)
    mis = correct_rollout(proximal, behaviour, mask, RolloutCorrection("mis", "token", 2.0))
    assert mis.mask.tolist() == rejection.mask.tolist()
    assert mis.token_weights.flatten().tolist() == pytest.approx([0.0, w[0][1], 1.0, w[1][0], 1.0, 0.0])
    # cap_low raises the floor: 0.61 < 0.7 now leaves the loss
    high_floor = correct_rollout(proximal, behaviour, mask, RolloutCorrection("mis", "token", 2.0, cap_low=0.7))
    assert high_floor.mask.tolist() == [[False, False, True], [False, True, False]]
    assert high_floor.token_weights.flatten().tolist() == pytest.approx([0.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    # TIS has no floor unless asked: cap_low lifts the small weights
    floored = correct_rollout(proximal, behaviour, mask, RolloutCorrection("tis", "token", 2.0, cap_low=0.7))
    assert floored.token_weights[0].tolist() == pytest.approx([2.0, 0.7, 1.0])

    seq = correct_rollout(proximal, behaviour, mask, RolloutCorrection("tis", "sequence", 2.0))
    assert seq.token_weights[0].tolist() == pytest.approx([math.exp(0.3)] * 3)  # e^(0.8-0.5) = 1.35 per token
    assert seq.token_weights[1, 0].item() == pytest.approx(math.exp(-0.5))
    seq_mis = correct_rollout(proximal, behaviour, mask, RolloutCorrection("mis", "sequence", 1.6))
    assert seq_mis.mask.tolist() == [[True, True, True], [False, False, False]]  # 1.35 ≤ 1.6, 0.61 < 1/1.6
    assert seq_mis.token_weights[0].tolist() == pytest.approx([math.exp(0.3)] * 3)


def test_geometric_keeps_sequences_by_their_mean_log_ratio_and_weighs_their_tokens_one_by_one():
    mask = torch.tensor([[True, True, True, True], [True, True, False, False], [True, True, True, False]])
    behaviour = torch.zeros(3, 4, dtype=torch.float64)
    # log ratios: row 0 mean 0.1 (kept), row 1 mean -0.8 (exp -0.8 = 0.45 < 1/2: dropped), row 2 mean 0.6 (kept at
    # cap 2: e^0.6 = 1.82), though its token 0.9 alone would be truncated at the cap
    proximal = torch.tensor([[0.5, -0.3, 0.4, -0.2], [-0.6, -1.0, 7.0, 7.0], [0.9, 0.3, 0.6, 5.0]],
                            dtype=torch.float64)
    rc = RolloutCorrection("mis", "geometric", 2.0)
    fix = correct_rollout(proximal, behaviour, mask, rc)
    assert fix.mask.tolist() == [[True] * 4, [False] * 4, [True, True, True, False]]
    want = [[math.exp(d) for d in (0.5, -0.3, 0.4, -0.2)], [0.0] * 4, [2.0, math.exp(0.3), math.exp(0.6), 0.0]]
    for row, expected in zip(fix.token_weights.tolist(), want, strict=True):
        assert row == pytest.approx(expected)
    assert fix.metrics["rollout/is_masked_frac"] == pytest.approx(2 / 9)
    rejected = correct_rollout(proximal, behaviour, mask, RolloutCorrection("rejection", "geometric", 2.0))
    assert rejected.mask.tolist() == fix.mask.tolist() and rejected.token_weights is None
    with pytest.raises(ValueError, match="level geometric masks whole sequences"):
        RolloutCorrection("tis", "geometric").validate()
    with pytest.raises(ValueError, match=r"rollout_correction.cap_low must be a number in \[0, 1\)"):
        RolloutCorrection("mis", cap_low=1.5).validate()


def test_mis_weights_the_gradient_of_the_tokens_it_keeps():
    """MIS (IcePop): g = Σ mask·w·A·∇log π; rejection drops the w, leaving the survivors' bias."""
    mask = torch.ones(1, 3, dtype=torch.bool)
    behaviour = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    proximal = torch.tensor([[-0.7, -1.2, -3.0]], dtype=torch.float64)  # w = e^0.3, e^-0.2, e^-2 (masked)
    grads = {}
    for mode in ("mis", "rejection"):
        fix = correct_rollout(proximal, behaviour, mask, RolloutCorrection(mode, "token", 2.0))
        logprobs = proximal.float().clone().requires_grad_(True)
        get_loss("reinforce")(logprobs, None, torch.tensor([1.0]), fix.mask, token_weights=fix.token_weights,
                              num_tokens=float(fix.mask.sum())).backward()
        grads[mode] = logprobs.grad[0].tolist()
    assert grads["mis"] == pytest.approx([-math.exp(0.3) / 2, -math.exp(-0.2) / 2, 0.0])
    assert grads["rejection"] == pytest.approx([-0.5, -0.5, 0.0])


def test_tis_weights_scale_each_tokens_gradient():
    inputs_grad = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask, adv = torch.ones(1, 2, dtype=torch.bool), torch.tensor([1.0])
    weights = torch.tensor([[2.0, 0.5]])
    loss = get_loss("reinforce")
    loss(inputs_grad, None, adv, mask, token_weights=weights).backward()
    assert inputs_grad.grad[0].tolist() == pytest.approx([-2.0 / 2, -0.5 / 2])  # -A·w per token, token-mean


def test_epochs_make_the_clip_engage_and_the_losses_differ():
    inputs, targets = None, None
    grads = {}
    for name in ("grpo", "gspo"):
        trainer, tok = fresh(name, lr=3e-3, epochs=4)
        inputs, targets = make_batch(tok, seed=1)
        on_policy = {**targets, "old_logprobs": trainer.proximal_logprobs(inputs, targets["padding_mask"])}
        metrics = update_policy(trainer, inputs, on_policy, seed=0)
        assert metrics["optimizer_steps"] == 4.0
        assert metrics["clip_frac_low_max"] + metrics["clip_frac_high_max"] > 0, name  # ratios left the clip range
        assert metrics["ratio_max_max"] > 1.0
        grads[name] = params(trainer)
    assert any(not torch.equal(p, q) for p, q in zip(grads["grpo"], grads["gspo"], strict=True))


def test_a_custom_loss_of_todays_contract_trains_with_mini_batches_and_rejection():
    trainer, tok = fresh(ScaledReinforceLoss(scale=2.0), lr=1e-3, mini_batches=2, epochs=2)
    inputs, targets = make_batch(tok)
    mask = targets["padding_mask"]
    noise = 0.4 * torch.randn(mask.shape, generator=torch.Generator().manual_seed(0))
    targets["old_logprobs"] = torch.where(mask, trainer.proximal_logprobs(inputs, mask) + noise, 0.0)  # behaviour
    before = params(trainer)
    metrics = update_policy(trainer, inputs, targets, seed=0,
                            correction=RolloutCorrection("rejection", "token", 1.5))
    assert metrics["optimizer_steps"] == 4.0 and metrics["scale"] == 2.0
    assert 0 < metrics["rollout/is_masked_frac"] < 1  # |noise| > log 1.5 masks a token
    assert any(not torch.equal(p, q) for p, q in zip(before, params(trainer), strict=True))
    for mode in ("tis", "mis"):
        with pytest.raises(ValueError, match=f"{mode} needs a loss whose forward takes token_weights"):
            update_policy(trainer, inputs, targets, seed=0, correction=RolloutCorrection(mode))


def test_masked_tokens_leave_the_loss_and_its_normaliser():
    trainer, tok = fresh("dapo", lr=1e-3)
    inputs, targets = make_batch(tok)
    keep = targets["padding_mask"].clone()
    keep[3, :4] = False  # mask half of row 3's tokens
    trainer.train_step(inputs, {**targets, "loss_mask": keep})
    assert trainer.metrics["num_tokens"] == float(keep.sum())


def test_an_all_masked_mini_batch_makes_no_optimizer_step():
    """Adam's momentum would move the weights on a step with zero gradients: a step with no token kept is not made."""
    trainer, tok = fresh("grpo", lr=1e-2, mini_batches=2)
    inputs, targets = make_batch(tok)
    update_policy(trainer, inputs, targets, seed=0)  # real steps: Adam now has momentum
    before, steps = params(trainer), trainer.step
    masked = {**targets, "loss_mask": torch.zeros_like(targets["padding_mask"])}
    metrics = update_policy(trainer, inputs, masked, seed=1)
    assert metrics["optimizer_steps"] == 0.0 and metrics["skipped"] == 2.0 and metrics["loss"] == 0.0
    assert trainer.step == steps
    assert all(torch.equal(p, q) for p, q in zip(before, params(trainer), strict=True))
    # one mini-batch masked, the other not: one step is made and its loss alone is reported
    half = torch.zeros_like(targets["padding_mask"])
    rows = mini_batch_rows(len(inputs), 2, 7)
    half[rows[0]] = targets["padding_mask"][rows[0]]
    metrics = update_policy(trainer, inputs, {**targets, "loss_mask": half}, seed=7)
    assert metrics["optimizer_steps"] == 1.0 and metrics["skipped"] == 1.0 and metrics["loss"] != 0.0


def test_the_lr_schedule_follows_the_rl_steps_when_fewer_optimizer_steps_happen():
    """mini_batches 4 on a batch of 2 rows makes 2 optimizer steps per RL step, not 4: the cosine is placed by the
    run's progress: RL step s starts at s/3 of the cosine (counting optimizer steps, the run would end before its
    middle)."""
    from forge_core.training import lr_factor

    trainer, tok = fresh("grpo", lr=1e-2, mini_batches=4, schedule="cosine", total_steps=3)
    inputs, targets = make_batch(tok)
    inputs, targets = select_rows(inputs, targets, torch.arange(2))
    lrs = []

    def step_fn(i, t):
        trainer.train_step(i, t)
        lrs.append(trainer.metrics["lr"])
        return dict(trainer.metrics)

    for step in range(3):
        update_policy(trainer, inputs, targets, seed=step, step=step, step_fn=step_fn)
    positions = [0, 0.25, 1, 1.25, 2, 2.25]
    assert lrs == pytest.approx([1e-2 * lr_factor(p * 4, trainer.config, 3) for p in positions])
    counted = [1e-2 * lr_factor(i, trainer.config, 3) for i in range(6)]
    assert lrs[-1] < 0.25 * counted[-1]  # 3/4 through the cosine; counting steps had it before its middle


@pytest.mark.parametrize("recompute", ["auto", "always", "never"])
def test_recompute_proximal_decides_what_the_clip_is_taken_against(recompute, monkeypatch):
    """A bf16 generator beside fp32 masters, on-policy: auto and always clip against the trainer's own policy (ratio
    1, no clipping; always pays one more forward pass), never against the generator's (its rounding reaches the
    ratio); every mode reports the mismatch."""
    trainer, tok = fresh("dapo", lr=1e-3, recompute_proximal=recompute)
    generator = copy.deepcopy(trainer.model).to(torch.bfloat16)
    inputs, targets = make_batch(tok)
    batch = collate(inputs, targets["padding_mask"], tok.pad_token_id)
    with torch.no_grad():
        behaviour, _ = sequence_logprobs(generator, batch.tokens, batch.attention_mask, batch.positions)
    targets["old_logprobs"] = torch.where(targets["padding_mask"], behaviour.float(), 0.0)
    calls = []
    real = trainer.proximal_logprobs
    monkeypatch.setattr(trainer, "proximal_logprobs", lambda *a: calls.append(1) or real(*a))
    metrics = update_policy(trainer, inputs, targets, seed=0)
    assert len(calls) == (1 if recompute == "always" else 0)
    if recompute == "never":
        assert metrics["ratio_max"] > 1.0 + 1e-4 or metrics["ratio_min"] < 1.0 - 1e-4
    elif recompute == "auto":  # the current policy is the proximal one: exactly 1
        assert metrics["ratio_min"] == 1.0 and metrics["ratio_max"] == 1.0
    else:  # recomputed in a separate forward pass: 1 up to rounding
        assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-5) and metrics["ratio_min"] == pytest.approx(1.0, abs=1e-5)
    if recompute != "never":
        assert metrics["clip_frac_low"] == 0.0 and metrics["clip_frac_high"] == 0.0
    assert 0.0 < metrics["rollout/behaviour_kl_k3"] < 0.05
    if recompute == "never":
        with pytest.raises(ValueError, match="recompute_proximal: never leaves no proximal policy"):
            update_policy(trainer, inputs, targets, seed=0, correction=RolloutCorrection("tis"))
