"""On-policy distillation: the per-token reverse-KL advantage by hand, its mix with the task reward, the teacher
a run names, the teachers that are refused, and an in-process step with a teacher."""

from __future__ import annotations

import math

import pytest
import torch

from forge_core.distill import DistillConfig, distill_metrics, load_teacher
from forge_core.recipes.steps import compute_advantages
from forge_core.types import Completion, Episode, Group
from infra import checkpoints as ckpt
from infra.config_checks import load_config
from infra.teacher import resolve_teacher


def episode(behaviour, teacher, reward=0.0, mask=None) -> Episode:
    e = Episode("p", "t", [1, 2], Completion("x", list(range(len(behaviour))), list(behaviour), loss_mask=mask))
    e.teacher_logprobs, e.reward = list(teacher), reward
    return e


def test_the_advantage_is_minus_coef_times_the_log_ratio_on_generated_tokens_only():
    # token 0: the teacher likes it more than the student (+), token 1: inserted by an environment (0),
    # token 2: the teacher likes it less (-)
    e = episode([-1.0, -2.0, -0.5], [-0.5, -9.0, -1.5], mask=[1, 0, 1])
    other = episode([-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0])
    episodes, _ = compute_advantages([Group("p", "t", [e, other])], "grpo", distill=DistillConfig("teacher", coef=2.0))
    assert episodes[0].token_advantages == pytest.approx([1.0, 0.0, -2.0])
    assert episodes[1].token_advantages == pytest.approx([0.0, 0.0, 0.0])  # student = teacher: nothing to learn
    assert episodes[0].advantage == 0.0 and episodes[1].advantage == 0.0  # reward_weight 0: the reward is not trained


def test_reward_weight_adds_that_share_of_the_group_advantage_to_every_token():
    good = episode([-1.0, -1.0], [-0.5, -1.0], reward=1.0)
    bad = episode([-1.0, -1.0], [-1.0, -3.0], reward=0.0)
    episodes, _ = compute_advantages([Group("p", "t", [good, bad])], "grpo",
                                     distill=DistillConfig("teacher", coef=1.0, reward_weight=0.5))
    group = 0.5 / (math.sqrt(0.5) + 1e-4)  # grpo: (r - mean) / (unbiased std + eps), ± this for rewards 1 and 0
    assert episodes[0].token_advantages == pytest.approx([0.5 * group + 0.5, 0.5 * group + 0.0])
    assert episodes[1].token_advantages == pytest.approx([-0.5 * group + 0.0, -0.5 * group - 2.0])


def test_without_a_teacher_the_advantages_are_the_group_ones():
    a, b = episode([-1.0], [-5.0], reward=1.0), episode([-1.0], [-5.0], reward=0.0)
    episodes, _ = compute_advantages([Group("p", "t", [a, b])], "grpo", distill=DistillConfig(teacher=""))
    assert episodes[0].token_advantages is None and episodes[0].advantage > 0 > episodes[1].advantage


def test_an_episode_the_teacher_did_not_score_is_an_error_not_a_zero():
    e = episode([-1.0], [-1.0])
    e.teacher_logprobs = None
    with pytest.raises(ValueError, match="without teacher logprobs"):
        compute_advantages([Group("p", "t", [e, episode([-1.0], [-1.0])])], "grpo", distill=DistillConfig("t"))


def test_metrics_average_over_generated_tokens():
    groups = [Group("p", "t", [episode([-1.0, -2.0, -3.0], [-0.5, -9.0, -1.0], mask=[1, 0, 1])])]
    m = distill_metrics(groups)
    assert m["distill/reverse_kl"] == pytest.approx(((-1.0 + 0.5) + (-3.0 + 1.0)) / 2)
    assert m["distill/teacher_logprob"] == pytest.approx((-0.5 - 1.0) / 2)


@pytest.mark.parametrize("overrides,message", [
    ({"distill.teacher": "tiny:qwen3-micro", "filter_groups": True}, "set filter_groups: false"),
    ({"distill.teacher": "tiny:qwen3-micro", "distill.coef": 0}, "distill.coef must be > 0"),
    ({"distill.teacher": "tiny:qwen3-micro", "distill.dtype": "int8"}, "distill.dtype 'int8'"),
    ({"distill.teacher": "no-such-run-or-model"}, "is neither a model directory, a run id or name"),
])
def test_bad_distill_settings_are_refused_naming_the_key(overrides, message, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGEFLOW_HOME", str(tmp_path))
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def make_run(home, run_id: str, checkpoint_steps: list[int]) -> None:
    """A run directory with COMPLETE checkpoints (HF config only) at `checkpoint_steps`."""
    run = home / "runs" / run_id
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    for step in checkpoint_steps:
        path = ckpt.step_dir(run / "checkpoints", step)
        (path / ckpt.HF_DIR).mkdir(parents=True)
        (path / ckpt.HF_DIR / "config.json").write_text("{}")
        (path / ckpt.STATE).write_bytes(b"state")
        ckpt.mark_complete(path, step, None, 0)


def test_a_run_id_or_name_means_its_latest_complete_checkpoint(tmp_path, monkeypatch):
    from infra.registry import repo, session_scope

    monkeypatch.setenv("FORGEFLOW_HOME", str(tmp_path))
    make_run(tmp_path, "20261207-000000-aaaaaa", [15, 30])
    unfinished = ckpt.step_dir(tmp_path / "runs" / "20261207-000000-aaaaaa" / "checkpoints", 45)
    (unfinished / ckpt.HF_DIR).mkdir(parents=True)  # no COMPLETE marker: ignored
    (unfinished / ckpt.HF_DIR / "config.json").write_text("{}")
    latest = tmp_path / "runs" / "20261207-000000-aaaaaa" / "checkpoints" / "step-000030" / "hf"
    assert resolve_teacher("20261207-000000-aaaaaa") == str(latest)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    with session_scope(url) as s:
        repo.create_run(s, "20261207-000000-aaaaaa", "grpo", {}, name="make-run", status="completed")
    assert resolve_teacher("make-run", url) == str(latest)
    assert resolve_teacher(str(latest)) == str(latest)  # a directory is itself: a pinned teacher resolves the same


def test_a_run_without_a_complete_checkpoint_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGEFLOW_HOME", str(tmp_path))
    make_run(tmp_path, "20261207-000000-bbbbbb", [])
    with pytest.raises(ValueError, match="has no complete checkpoint yet"):
        resolve_teacher("20261207-000000-bbbbbb")
    (tmp_path / "model").mkdir()
    with pytest.raises(ValueError, match="directory without config.json"):
        resolve_teacher(str(tmp_path / "model"))


def save_tiny_teacher(path, alphabet: str | None = None, chat_template: str | None = None) -> str:
    from forge_core.models import save_model_and_tokenizer
    from forge_core.models.loading import build_tiny_model
    from forge_core.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(alphabet)
    if chat_template is not None:
        tok.chat_template = chat_template
    save_model_and_tokenizer(build_tiny_model("qwen3-micro", tok, seed=1), tok, path)
    return str(path)


@pytest.mark.parametrize("alphabet,template,named", [
    ("0123456789+=", None, "vocabulary: 17 tokens against the student's"),
    (None, "{{ messages[0]['content'] }}", "chat template"),
])
def test_a_teacher_with_another_tokenizer_is_refused_naming_the_difference(tmp_path, alphabet, template, named):
    from forge_core.models.tokenizer import build_char_tokenizer

    path = save_tiny_teacher(tmp_path / "teacher", alphabet, template)
    with pytest.raises(ValueError, match="has another tokenizer than the student") as err:
        load_teacher(DistillConfig(path), build_char_tokenizer())  # where the teacher worker loads it
    assert named in str(err.value)
    # and when the config loads, before any worker starts (the student: model.path's tokenizer)
    with pytest.raises(ValueError, match=f"defaults \\+ overrides: distill.teacher .* has another tokenizer.*{named}"):
        load_config(None, {"model.path": "tiny:qwen3-micro", "distill.teacher": path, "dataset.train_size": 1000})


def test_an_in_process_step_scores_with_the_teacher_and_trains_on_its_signal(tmp_path):
    """One GRPOLoop step with a teacher: distill/* recorded; the teacher equal to the student gives a reverse KL of
    ~0 (the generator's and the teacher's logprobs of the same tokens), another teacher a clearly positive one."""
    from forge_core.data import make_arith_problems
    from forge_core.generation import SamplingParams, TorchGenerator
    from forge_core.losses import get_loss
    from forge_core.models import load_model_and_tokenizer
    from forge_core.recipes.config import EvalConfig, GRPOConfig
    from forge_core.recipes.grpo import GRPOLoop
    from forge_core.rewards import CombinedReward
    from forge_core.training import Trainer, TrainerConfig

    problems = make_arith_problems(16, seed=0)
    prompts = [p.question for p in problems]

    def step_with(teacher_path: str) -> dict:
        model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=1)
        teacher = load_teacher(DistillConfig(teacher_path), tok)
        loop = GRPOLoop(TorchGenerator(model, tok, SamplingParams(max_new_tokens=4)),
                        Trainer(model, get_loss("grpo"), TrainerConfig(lr=1e-3), tok.pad_token_id),
                        CombinedReward([("zero", lambda p, r, t: 0.0, 1.0)]), problems, prompts, problems[:2],
                        prompts[:2], GRPOConfig(steps=1, prompts_per_step=4, group_size=4), tok.pad_token_id,
                        teacher_model=teacher, distill=DistillConfig(teacher_path), eval=EvalConfig(every=0))
        before = [p.detach().clone() for p in model.parameters()]
        metrics = loop.run_step(0)
        metrics["moved"] = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        return metrics

    same = step_with(save_tiny_teacher(tmp_path / "same"))  # seed 1: the student's own weights
    assert abs(same["distill/reverse_kl"]) < 1e-4 and same["timing/teacher"] > 0
    from forge_core.models import save_model_and_tokenizer
    from forge_core.models.loading import build_tiny_model
    from forge_core.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    other = save_model_and_tokenizer(build_tiny_model("qwen3-micro", tok, seed=7), tok, tmp_path / "other")
    differs = step_with(str(other))
    # a one-sample estimate of KL(student ‖ teacher) over 64 tokens: positive for two different random models
    # (near-uniform both, so small: ~0.02 nats per token), two orders above the identical teacher's
    assert differs["distill/reverse_kl"] > 100 * max(abs(same["distill/reverse_kl"]), 1e-5) and differs["moved"]
    assert differs["reward/mean"] == 0.0  # every reward is 0, so only the teacher's signal moved the weights
