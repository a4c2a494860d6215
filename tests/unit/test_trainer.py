import math

import pytest
import torch

from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer
from forge_core.training import Trainer, TrainerConfig, lr_factor, state_sha256
from forge_core.training.trainer import save_atomically


def make_batch(tok, seed=0, b=6):
    g = torch.Generator().manual_seed(seed)
    inputs, lengths = [], [1, 5, 3, 8, 2, 6][:b]
    t = max(lengths)
    response = torch.full((b, t), tok.pad_token_id)
    mask = torch.zeros(b, t, dtype=torch.bool)
    for i, n in enumerate(lengths):
        prompt = torch.randint(5, len(tok), (3 + i % 3,), generator=g)
        resp = torch.randint(5, len(tok), (n,), generator=g)
        response[i, :n], mask[i, :n] = resp, True
        inputs.append({"tokens": torch.cat([prompt, resp])})
    targets = {
        "response": response, "padding_mask": mask,
        "advantages": torch.randn(b, generator=g),
        "old_logprobs": torch.where(mask, -3.0 + 0.5 * torch.randn(b, t, generator=g), 0.0),
        "ref_logprobs": None,
    }
    return inputs, targets


def fresh(loss="dapo", **settings):
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    options = {k: settings.pop(k) for k in ("total_steps", "temperature", "compute_dtype") if k in settings}
    return Trainer(model, get_loss(loss), TrainerConfig(**settings), tok.pad_token_id, **options), tok


@pytest.mark.parametrize("loss", ["dapo", "grpo", "gspo"])
def test_micro_batching_matches_full_batch(loss):
    t_full, tok = fresh(loss, lr=1e-3, micro_batch_size=64)
    t_micro, _ = fresh(loss, lr=1e-3, micro_batch_size=4)  # unequal token counts: rows 0-3 vs 4-5
    inputs, targets = make_batch(tok)
    a = t_full.train_step(inputs, targets)
    b = t_micro.train_step(inputs, targets)
    assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert t_full.metrics["grad_norm"] == pytest.approx(t_micro.metrics["grad_norm"], rel=1e-4)
    for p, q in zip(t_full.model.parameters(), t_micro.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_gradient_clipping_is_applied():
    trainer, tok = fresh("reinforce", lr=1e-3, max_norm=1e-3)
    seen = []

    def spy(_optimizer, _args, _kwargs):
        norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in trainer.model.parameters() if p.grad is not None))
        seen.append(norm.item())

    trainer.optimizer.register_step_pre_hook(spy)
    trainer.train_step(*make_batch(tok))
    assert trainer.metrics["grad_norm"] > 1e-2  # the reported norm is the pre-clip one
    assert seen[0] <= 1e-3 * (1 + 1e-4)


def test_non_finite_loss_raises_before_touching_weights():
    trainer, tok = fresh("dapo", lr=1e-2)
    inputs, targets = make_batch(tok)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    targets["advantages"][2] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite loss .* at step 0"):
        trainer.train_step(inputs, targets)
    for p, q in zip(before, trainer.model.parameters()):
        assert torch.equal(p, q)
    assert all(p.grad is None for p in trainer.model.parameters())
    assert trainer.step == 0


def test_save_load_round_trip_gives_identical_next_step(tmp_path):
    a, tok = fresh("dapo", lr=1e-3, schedule="cosine", total_steps=10, warmup_steps=2)
    batches = [make_batch(tok, seed=s) for s in range(3)]
    a.train_step(*batches[0])
    a.train_step(*batches[1])
    digest = a.save(tmp_path / "state.pt")
    expected = a.train_step(*batches[2])
    b, _ = fresh("dapo", lr=1e-3, schedule="cosine", total_steps=10, warmup_steps=2)
    b.load(tmp_path / "state.pt")
    assert b.step == 2
    assert state_sha256(b.state_dict()) == digest  # the loaded state hashes like the saved one
    got = b.train_step(*batches[2])
    assert got == expected
    assert b.metrics["lr"] == a.metrics["lr"]
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)


def test_metrics_are_reported():
    trainer, tok = fresh("grpo", lr=1e-3, entropy_coef=0.01)
    trainer.train_step(*make_batch(tok))
    m = trainer.metrics
    for key in ("loss", "grad_norm", "lr", "entropy", "clip_frac_low", "clip_frac_high", "ratio_mean"):
        assert key in m and math.isfinite(m[key])
    assert m["entropy"] > 0


def test_lr_schedules():
    s = TrainerConfig(lr=1.0, warmup_steps=4, schedule="cosine", min_lr_ratio=0.1)
    assert [lr_factor(i, s, 14) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, s, 14) == pytest.approx(1.0)
    assert lr_factor(9, s, 14) == pytest.approx(0.55)
    assert lr_factor(14, s, 14) == pytest.approx(0.1)
    lin = TrainerConfig(lr=1.0, schedule="linear")
    assert lr_factor(5, lin, 10) == pytest.approx(0.5)
    # warmup and horizon count RL steps: with 2 mini-batches × 2 epochs an RL step is 4 optimizer steps
    ppo = TrainerConfig(lr=1.0, warmup_steps=1, schedule="linear", mini_batches=2, epochs=2)
    assert [lr_factor(i, ppo, 3) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(8, ppo, 3) == pytest.approx(0.5)
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    with pytest.raises(ValueError, match="trainer.schedule 'cosine' needs a positive number of steps"):
        Trainer(model, get_loss("grpo"), TrainerConfig(schedule="cosine"), tok.pad_token_id)


def test_state_hash_sees_every_value_and_ignores_file_bytes(tmp_path):
    import random

    import numpy as np

    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 3, "half": torch.ones(2, dtype=torch.bfloat16),
             "rng": {"python": random.getstate(), "numpy": np.random.get_state()}, "scalar": torch.tensor(1.5)}
    digest = state_sha256(state)
    save_atomically(state, tmp_path / "a.pt")
    save_atomically(state, tmp_path / "b.pt")
    # torch.save's bytes differ between writes (serialization id); the state hash does not
    assert state_sha256(torch.load(tmp_path / "b.pt", weights_only=False)) == digest
    changed = {**state, "w": state["w"].clone()}
    changed["w"][1, 2] = torch.nextafter(changed["w"][1, 2], torch.tensor(10.0))  # one ulp
    assert state_sha256(changed) != digest
    assert state_sha256({**state, "step": 4}) != digest
    assert state_sha256({**state, "w": state["w"].T.contiguous()}) != digest  # same bytes, other shape


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB tmpfs (needs root, as `make test` runs): writing past it fails with ENOSPC."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_disk_full_while_saving_leaves_the_previous_file(small_disk):
    path = small_disk / "state.pt"
    save_atomically({"v": torch.zeros(1000)}, path)
    before = path.read_bytes()
    with pytest.raises(OSError, match="previous file is unchanged — free space"):
        save_atomically({"v": torch.ones(200_000)}, path)  # 800 KB on a 256 KiB disk
    assert path.read_bytes() == before and sorted(p.name for p in small_disk.iterdir()) == ["state.pt"]
    assert torch.equal(torch.load(path)["v"], torch.zeros(1000))


def test_a_step_reads_its_metrics_from_the_device_once_however_many_micro_batches(monkeypatch):
    """Losses keep their metrics as tensors; the trainer reads the normalisers once and every metric once per
    optimizer step (before: about a dozen reads per micro-batch, each a host synchronisation on a GPU)."""
    import traceback

    from forge_core.losses import get_loss

    reads: list[str] = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, **kwargs):
            frame = traceback.extract_stack(limit=2)[0]
            # ours, not the model library's; collate reads the host-side padding mask (no device involved)
            if "forge_core" in frame.filename and not frame.filename.endswith("batching.py"):
                reads.append(f"{frame.filename}:{frame.lineno} {frame.line}")
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    per_step = {}
    for micro in (1, 64):
        model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
        trainer = Trainer(model, get_loss("grpo", beta=0.04), TrainerConfig(lr=1e-3, micro_batch_size=micro,
                                                                            share_prompts=False), tok.pad_token_id)
        inputs, targets = make_batch(tok)
        targets = {**targets, "ref_logprobs": targets["old_logprobs"] - 0.1,
                   "behaviour_logprobs": targets["old_logprobs"], "old_logprobs": None}
        reads.clear()
        trainer.train_step(inputs, targets)
        per_step[micro] = len(reads)
        assert {"ratio_max", "clip_frac_high", "kl_mean", "rollout/behaviour_kl_k3"} <= set(trainer.metrics)
        assert all(isinstance(v, float) for v in trainer.metrics.values())
    assert len(inputs) > 1 and per_step == {1: 2, 64: 2}, reads
