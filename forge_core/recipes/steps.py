"""The step functions of one GRPO iteration (rollout → reward → reference → teacher → advantages → train → sync).

The in-process roles (recipes/local.py) and the workers (workers/) call these; each takes the components it needs
explicitly.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from forge_core.advantages import (
    assign_group_advantages,
    collect_informative_groups,
    filter_informative_groups,
)
from forge_core.data.problems import Problem
from forge_core.distill import DistillConfig, assign_distill_advantages, distill_metrics
from forge_core.envs.base import EnvConfig
from forge_core.envs.episodes import env_metrics, sample_env_groups
from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.protocols import Batch
from forge_core.recipes.reward_watch import FAILED
from forge_core.rewards import CombinedReward, MathReward
from forge_core.seeding import step_seed
from forge_core.training import Trainer, episodes_to_train_inputs, sequence_logprobs
from forge_core.training.batching import collate
from forge_core.types import Episode, Group


def sample_prompt_indices(num_problems: int, k: int, seed: int, step: int) -> list[int]:
    """The problem indices of `step`: a pure function of (seed, step), so a re-run step sees the same prompts."""
    if k > num_problems:
        raise ValueError(f"prompts_per_step={k} exceeds the {num_problems} training problems; lower prompts_per_step")
    return random.Random(step_seed(seed, step, salt=1)).sample(range(num_problems), k)


def rollout(generator: TorchGenerator, problems: Sequence[Problem], prompts: Sequence[str], group_size: int,
            seed: int, params: SamplingParams | None = None, prompt_keys: Sequence[int] | None = None,
            env: EnvConfig | None = None) -> list[Group]:
    """Sample `group_size` completions for each prompt; one Group per problem. Prompt i is seeded with
    seed + prompt_keys[i] (default i): a replica given part of a step's prompts samples them as one generator would.
    With an `env` (env.name set): multi-turn episodes in that environment, rewarded by it (`prompts` unused: the
    environment writes the opening messages)."""
    if env is not None and env.enabled:
        return sample_env_groups(generator, problems, group_size, seed, params or generator.params, env, prompt_keys)
    # token-in, token-out: each prompt is tokenized once; the generator samples from these ids and the trainer
    # trains on the same ids followed by the sampled ones (no text is re-tokenized in between)
    rows = generator.tokenize(list(prompts))
    completions = generator.generate(list(prompts), n=group_size, seed=seed, params=params,
                                     prompt_keys=None if prompt_keys is None else list(prompt_keys), prompt_ids=rows)
    groups = []
    for problem, prompt, prompt_ids, comps in zip(problems, prompts, rows, completions, strict=True):
        episodes = [Episode(prompt, problem.solution, prompt_ids, c) for c in comps]
        groups.append(Group(prompt, problem.solution, episodes, question=problem.question))
    return groups


def sample_with_refills(sample_round: Callable[[int, int], Batch], num_groups: int,
                        fill_rounds: int) -> Batch:
    """DAPO dynamic sampling: `sample_round(n, salt)` samples and scores n groups (salt = the round, 0 first);
    uninformative groups (all rewards equal) are replaced by fresh prompts for up to `fill_rounds` rounds.
    Returns the groups and the first round's reward/* metrics plus rollout/fill_rounds, sampled_groups and
    refill_dropped."""
    rounds: list[dict[str, float]] = []  # each round's reward metrics

    def sample(n: int) -> list[Group]:
        groups, metrics = sample_round(n, len(rounds))
        rounds.append(metrics)
        return groups

    groups, stats = collect_informative_groups(sample, num_groups, fill_rounds)
    return groups, {**rounds[0], "rollout/fill_rounds": float(stats.rounds), "rollout/sampled_groups": float(stats.sampled),
                    "rollout/refill_dropped": float(stats.dropped)}


def sample_batch(step: int, num_problems: int, prompts_per_step: int, seed: int,
                 sample: Callable[[list[int], int], list[Group]], score: Callable[[list[Group]], Batch] | None = None,
                 fill_rounds: int = 1) -> Batch:
    """The step's training groups, in-process or through workers alike: `sample(indices, seed)` rolls out the
    training problems at `indices`; with `score` (DAPO dynamic sampling) each round is scored and dropped groups are
    refilled with fresh prompts for up to `fill_rounds` rounds. Round r draws its prompts and sampling seed from
    (seed, step, r), so a resumed or retried step samples the same."""

    def sample_round(n: int, salt: int) -> Batch:
        indices = sample_prompt_indices(num_problems, n, seed + 7919 * salt, step)
        groups = sample(indices, step_seed(seed, step, salt))
        return score(groups) if score is not None else (groups, {})

    if score is not None:
        return sample_with_refills(sample_round, prompts_per_step, fill_rounds)
    return sample_round(prompts_per_step, 0)


def round_scorer(refills: bool, env_enabled: bool,
                 score: Callable[[list[Group]], Batch]) -> Callable[[list[Group]], Batch] | None:
    """How sample_batch scores each sampling round: None without refills; an environment's episodes come back
    rewarded (only their reward/* metrics are computed), the others are scored by `score`."""
    if not refills:
        return None
    return (lambda groups: (groups, reward_metrics(groups))) if env_enabled else score


def score_rewards(groups: list[Group], reward: CombinedReward) -> dict[str, float]:
    """Set each episode's reward (and per-function breakdown); returns reward/* metrics."""
    episodes = [e for g in groups for e in g.episodes]
    scores = reward.score_batch([(e.prompt, e.completion.text, e.target) for e in episodes])
    for e, s in zip(episodes, scores, strict=True):
        e.reward, e.reward_breakdown = s.total, s.breakdown
        set_reward_errors(e, s.errors)
    return reward_metrics(groups, errors=sum(len(s.errors) for s in scores))


def set_reward_errors(episode: Episode, errors: dict[str, str]) -> None:
    """Record on the episode which reward functions raised and how (what a RewardFailureWatch quotes); a rescored
    episode forgets earlier errors."""
    if errors:
        episode.completion.metadata["reward_errors"] = dict(errors)
    else:
        episode.completion.metadata.pop("reward_errors", None)


def reward_metrics(groups: list[Group], errors: float = 0.0) -> dict[str, float]:
    """reward/mean, reward/std, reward/errors, the mean of each reward function and the share of episodes it raised
    on (reward/failed/<name>) over the scored episodes (the same numbers however the groups were split over reward
    workers; an episode's continuation samples once)."""
    episodes = [e for g in groups for e in g.episodes if not e.continues]
    totals = [e.reward for e in episodes]
    per_fn: dict[str, list[float]] = {}
    for e in episodes:
        for k, v in e.reward_breakdown.items():
            per_fn.setdefault(k, []).append(v)
    metrics = {"reward/mean": statistics.fmean(totals), "reward/std": statistics.pstdev(totals),
               "reward/errors": float(errors)}
    metrics.update({f"reward/{k}": statistics.fmean(v) for k, v in per_fn.items()})
    # the share of episodes each function raised on (a RewardFailureWatch stops a run where one always does)
    failed = [e.completion.metadata.get("reward_errors", {}) for e in episodes]
    metrics.update({f"{FAILED}{k}": sum(k in f for f in failed) / len(episodes) for k in per_fn})
    return metrics


@torch.no_grad()
def model_logprobs(model, groups: list[Group], pad_id: int, temperature: float = 1.0,
                   micro_batch_size: int = 64) -> list[list[list[float]]]:
    """The logprobs `model` gives each episode's completion tokens (the exact ids sampled: token-in), shaped
    groups → episodes → [T]; scored in micro-batches of episodes."""
    episodes = [e for g in groups for e in g.episodes]
    rows: list[list[float]] = []
    for start in range(0, len(episodes), micro_batch_size):
        part = episodes[start:start + micro_batch_size]
        inputs, targets = episodes_to_train_inputs(part, pad_id)
        batch = collate(inputs, targets["padding_mask"], pad_id)
        lp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, batch.positions, temperature)
        rows.extend(row[: len(e.completion.token_ids)].tolist() for e, row in zip(part, lp, strict=True))
    it = iter(rows)
    return [[next(it) for _ in g.episodes] for g in groups]


def attach_logprobs(groups: list[Group], rows: list[list[list[float]]], field: str) -> None:
    """Write `rows` (groups → episodes → [T]) onto the episodes as `field` (ref_logprobs or teacher_logprobs)."""
    for g, row in zip(groups, rows, strict=True):
        for e, lp in zip(g.episodes, row, strict=True):
            setattr(e, field, lp)


LOGPROB_FIELDS = {"reference": "ref_logprobs", "teacher": "teacher_logprobs"}  # the episode field each role writes


def scorer_metrics(role: str, groups: list[Group], seconds: float) -> dict[str, float]:
    """What scoring with a frozen model reports: timing/<role>, and the distill/* figures of a teacher's scores."""
    metrics = {f"timing/{role}": seconds}
    if role == "teacher":
        metrics.update(distill_metrics(groups))
    return metrics


def compute_advantages(groups: list[Group], name: str = "grpo", drop_uninformative: bool = False,
                       distill: DistillConfig | None = None, **kwargs) -> tuple[list[Episode], dict[str, float]]:
    """Advantages for all episodes; optionally drops all-equal groups (DAPO); with an enabled `distill` section,
    the teacher's per-token reverse-KL advantage mixed with reward_weight × the group one. Returns (episodes,
    metrics)."""
    dropped = 0
    if drop_uninformative:
        groups, dropped = filter_informative_groups(groups)
    if groups:
        assign_group_advantages(groups, name, **kwargs)
        if distill is not None and distill.enabled:
            assign_distill_advantages(groups, distill)
    episodes = [e for g in groups for e in g.episodes]
    return episodes, {"rollout/dropped_groups": float(dropped)}


def sync_weights(generator: TorchGenerator, trainer: Trainer, version: int) -> None:
    """Make the generator sample from the trainer's weights (same process: share, else copy)."""
    if generator.model is not trainer.model:
        generator.load_state_dict(trainer.model.state_dict(), version)
    generator.policy_version = version
    generator.model.eval()


def rollout_metrics(groups: list[Group], step: int, seconds: float) -> dict[str, float]:
    """rollout/* length, truncation, throughput and staleness statistics of step `step`'s groups sampled in
    `seconds`; staleness = step - the version that sampled an episode, also as a histogram (fraction per age)."""
    comps = [e.completion for g in groups for e in g.episodes]
    if not comps:  # dynamic sampling kept no group (every round all-equal): nothing to train, nothing to describe
        return {"rollout/num_episodes": 0.0, "rollout/tokens_per_s": 0.0, "timing/rollout": seconds}
    lengths = [len(c.token_ids) for c in comps]
    ages = [step - c.policy_version for c in comps]
    ends = [e.completion.stop_reason for g in groups for e in g.episodes if not e.continues]  # one per episode
    metrics = {
        "rollout/response_len_mean": statistics.fmean(lengths),
        "rollout/response_len_max": float(max(lengths)),
        # cut by a token or turn limit; an episode an error ended (a parse error, an unknown tool, an environment
        # that crashed or hung: env/status_* tell which) is counted in rollout/error_rate instead
        "rollout/truncation_rate": ends.count("length") / len(ends),
        "rollout/error_rate": sum(r not in ("eos", "length") for r in ends) / len(ends),
        "rollout/num_episodes": float(len(comps)),
        "rollout/tokens_per_s": sum(lengths) / max(seconds, 1e-9),
        "timing/rollout": seconds,
        "rollout/policy_version": float(min(c.policy_version for c in comps)),
        "rollout/policy_staleness": float(max(ages)),
        # rollouts that asked for a version the weight store no longer had (sampled with another: not bit-exact)
        "rollout/pinned_version_misses": float(sum("pinned_version_missed" in c.metadata for c in comps)),
    }
    metrics.update({f"rollout/staleness_{age}": ages.count(age) / len(ages) for age in sorted(set(ages))})
    played = env_metrics([e for g in groups for e in g.episodes])
    if played:  # multi-turn episodes: the environment rewarded them while they were played (no reward phase)
        metrics.update({**played, **reward_metrics(groups)})
    return metrics


def pass_at_k(hits: Sequence[Sequence[bool]]) -> float:
    """pass@k with k = the samples per prompt: the fraction of prompts with at least one correct sample."""
    return sum(any(h) for h in hits) / max(len(hits), 1)


def evaluate(generator: TorchGenerator, problems: Sequence[Problem], prompts: Sequence[str], max_new_tokens: int,
             judge=None, samples: int = 0, temperature: float = 1.0, seed: int = 0,
             prompt_keys: Sequence[int] | None = None, env: EnvConfig | None = None, envs=None) -> dict[str, float]:
    """Held-out greedy accuracy (judge = MathReward: 1.0 means correct); with samples > 0 also the mean
    sampled accuracy at `temperature`, a smoother signal than the greedy one, and pass@samples (prompt i seeded
    with seed + prompt_keys[i], default i). With an `env`: episodes in it, correct when the environment says they
    are solved (forge_core/envs/base.py), and the greedy episodes' env/* figures as eval/turns_mean and
    eval/tool_calls_mean (`envs`: where the environments run, default this process)."""
    judge = judge or MathReward()
    start = time.perf_counter()
    keys = None if prompt_keys is None else list(prompt_keys)
    metrics: dict[str, float] = {}

    def attempts(params: SamplingParams, n: int) -> list[list[bool]]:
        if env is not None and env.enabled:
            groups = sample_env_groups(generator, problems, n, seed, params, env, keys, envs)
            if n == 1:
                played = env_metrics([e for g in groups for e in g.episodes])
                metrics.update({"eval/turns_mean": played["env/turns_mean"],
                                "eval/tool_calls_mean": played["env/tool_calls_mean"]})
            return [[bool(e.completion.metadata["solved"]) for e in g.episodes if not e.continues] for g in groups]
        outs = generator.generate(list(prompts), n=n, seed=seed, params=params, prompt_keys=keys)
        return [[judge(p, c.text, prob.solution) >= 1.0 for c in o] for p, o, prob in zip(prompts, outs, problems,
                                                                                          strict=True)]

    correct = [h[0] for h in attempts(SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens), 1)]
    metrics["eval/accuracy"] = sum(correct) / len(correct)
    if samples:
        hits = attempts(SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens), samples)
        metrics["eval/sampled_accuracy"] = sum(map(sum, hits)) / sum(map(len, hits))
        metrics[f"eval/pass_at_{samples}"] = pass_at_k(hits)
    metrics["timing/eval"] = time.perf_counter() - start
    return metrics
