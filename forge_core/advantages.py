"""Group-relative advantages (grpo, dr_grpo, rloo) and DAPO's dynamic filtering of uninformative groups."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from forge_core.types import Group

log = logging.getLogger(__name__)


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-element group size, group sum and group sum of squares, each [N] (float64 for stability)."""
    r = rewards.to(torch.float64)
    num_groups = int(group_ids.max().item()) + 1 if group_ids.numel() else 0
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_ids, torch.ones_like(r))
    total = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_ids, r)
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_ids, r * r)
    return count[group_ids], total[group_ids], sq[group_ids]


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(r - group mean) / (unbiased group std + eps) per episode [N]; singleton and all-equal groups give 0."""
    n, total, sq = _group_stats(rewards, group_ids)
    mean = total / n
    var = ((sq - n * mean * mean) / (n - 1).clamp(min=1)).clamp(min=0.0)
    centred = rewards.to(torch.float64) - mean
    # all-equal groups: rounding can leave |centred| ~ 1e-16; treat as exactly 0
    centred = torch.where(var <= 1e-24, torch.zeros_like(centred), centred)
    adv = centred / (var.sqrt() + eps)
    return torch.where(n > 1, adv, torch.zeros_like(adv)).to(rewards.dtype)


def dr_grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """r - group mean per episode [N] (Dr. GRPO: no std normalisation)."""
    n, total, _ = _group_stats(rewards, group_ids)
    adv = rewards.to(torch.float64) - total / n
    return torch.where(n > 1, adv, torch.zeros_like(adv)).to(rewards.dtype)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """r_i - mean of the other rewards in the group, per episode [N]."""
    n, total, _ = _group_stats(rewards, group_ids)
    r = rewards.to(torch.float64)
    adv = r - (total - r) / (n - 1).clamp(min=1)
    return torch.where(n > 1, adv, torch.zeros_like(adv)).to(rewards.dtype)


ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}


def compute_advantages(name: str, rewards: torch.Tensor, group_ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """Advantages [N] from rewards [N] and integer group ids [N] with the estimator named `name`."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage.name {name!r}; choose one of {sorted(ADVANTAGES)}")
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards and group_ids must both be [N]; got {tuple(rewards.shape)}, {tuple(group_ids.shape)}")
    return ADVANTAGES[name](rewards, group_ids.long(), **kwargs)


def group_advantages(groups: list[Group], name: str = "grpo", **kwargs) -> list[float]:
    """The advantage of every episode of `groups` (in order) from their rewards, without changing the episodes; a
    continuation sample (Episode.continues) gets the advantage of the episode it continues."""
    rewards = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float64)
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.rewards], dtype=torch.long)
    heads = iter(compute_advantages(name, rewards, ids, **kwargs).tolist())
    out: list[float] = []
    for g in groups:
        for e in g.episodes:
            out.append(out[-1] if e.continues else next(heads))
    return out


def episode_heads(groups: list[Group]) -> list[tuple[int, int]]:
    """(group, position) of the episode every sample of `groups` belongs to, in order (a continuation: its head's)."""
    heads: list[tuple[int, int]] = []
    for g_i, g in enumerate(groups):
        for e_i, e in enumerate(g.episodes):
            heads.append(heads[-1] if e.continues else (g_i, e_i))
    return heads


def turn_returns(groups: list[Group]) -> dict[tuple[int, int, int], float]:
    """The return from turn t on of every episode credited per turn, keyed (group, position, t)."""
    return {(g_i, e_i, t): value for g_i, g in enumerate(groups) for e_i, e in enumerate(g.episodes)
            if not e.continues for t, value in enumerate(e.completion.metadata.get("turn_returns", []))}


def advantages_by_turn(groups: list[Group], name: str, episode_advantage: dict[tuple[int, int], float],
                       **kwargs) -> dict[tuple[int, int, int], float]:
    """Each turn's advantage, keyed (group, position, t): the estimator's, over the returns of the group's episodes
    that reached turn t; a turn no other episode of its group reached takes its episode's advantage (no peer to
    compare it with: the decisive last turn of the longest episode still learns from how the episode went)."""
    returns = turn_returns(groups)
    buckets: dict[tuple[int, int], int] = {}
    ids = [buckets.setdefault((g_i, t), len(buckets)) for g_i, _, t in returns]
    if not ids:
        return {}
    adv = compute_advantages(name, torch.tensor(list(returns.values()), dtype=torch.float64),
                             torch.tensor(ids, dtype=torch.long), **kwargs).tolist()
    # GiGPO's rule for a step group of one (Feng et al. 2025, arXiv:2505.10978; verl-agent gigpo/core_gigpo.py:
    # A = A_episode + w * A_step, and a lone step's A_step is 0): the turn keeps its episode-level advantage
    peers = Counter(ids)
    return {key: a if peers[b] > 1 else episode_advantage[key[:2]]
            for key, a, b in zip(returns, adv, ids, strict=True)}


def turn_advantages(groups: list[Group], name: str = "grpo", episode_advantages: list[float] | None = None,
                    **kwargs) -> list[list[float] | None]:
    """Per-token advantages [T] of every episode of `groups` (in order) whose metadata has `turn_returns`
    (env.credit: turn), else None. The tokens the model generated in turn t get that turn's advantage
    (advantages_by_turn); inserted tokens get 0. Turn 0's advantage is the episode's `group_advantages` one
    (`episode_advantages`: those, when already computed)."""
    heads = episode_heads(groups)
    if episode_advantages is None:
        episode_advantages = group_advantages(groups, name, **kwargs)
    by_turn = advantages_by_turn(groups, name, dict(zip(heads, episode_advantages, strict=True)), **kwargs)
    out: list[list[float] | None] = []
    for e, (g_i, e_i) in zip((e for g in groups for e in g.episodes), heads, strict=True):
        meta = e.completion.metadata
        if "turn_returns" not in meta:
            out.append(None)
            continue
        mask = e.completion.loss_mask or [1] * len(e.completion.token_ids)
        starts = list(meta["turn_starts"]) + [len(mask)]
        tokens = [0.0] * len(mask)
        for k in range(len(starts) - 1):
            a = by_turn[(g_i, e_i, meta["first_turn"] + k)]
            for j in range(starts[k], starts[k + 1]):
                tokens[j] = a if mask[j] else 0.0
        out.append(tokens)
    return out


def assign_group_advantages(groups: list[Group], name: str = "grpo", **kwargs) -> None:
    """Compute advantages for every episode of `groups` in place (and per-token ones where rewards are credited
    per turn)."""
    adv = group_advantages(groups, name, **kwargs)
    tokens = turn_advantages(groups, name, adv, **kwargs)
    for episode, a, t in zip((e for g in groups for e in g.episodes), adv, tokens, strict=True):
        episode.advantage, episode.token_advantages = a, t


def trained_signals(group: Group) -> list[list[float]]:
    """The values the group's advantages compare: its episodes' rewards and, for episodes credited per turn
    (env.credit: turn), each turn's returns among the episodes that reached it."""
    per_turn: dict[int, list[float]] = {}
    for e in group.episodes:
        if not e.continues:
            for t, value in enumerate(e.completion.metadata.get("turn_returns", [])):
                per_turn.setdefault(t, []).append(value)
    return [group.rewards, *per_turn.values()]


def is_informative(group: Group, tol: float = 1e-9) -> bool:
    """True when some advantage of the group can be nonzero: its rewards differ, or (credited per turn) the returns
    of some turn differ among the episodes that reached it (equal totals can hide turns that did better)."""
    return any(len(v) > 1 and max(v) - min(v) > tol for v in trained_signals(group))


def filter_informative_groups(groups: list[Group]) -> tuple[list[Group], int]:
    """DAPO dynamic sampling: drop the groups whose advantages would all be 0 (is_informative); returns (kept,
    number dropped)."""
    kept = [g for g in groups if is_informative(g)]
    return kept, len(groups) - len(kept)


@dataclass
class FillStats:
    """What `collect_informative_groups` did: sampling rounds, groups sampled and dropped, whether it filled."""

    rounds: int
    sampled: int
    dropped: int
    filled: bool


def collect_informative_groups(
    sample_groups: Callable[[int], list[Group]], num_groups: int, max_rounds: int = 4
) -> tuple[list[Group], FillStats]:
    """Keep calling `sample_groups(n)` until `num_groups` informative groups are collected or `max_rounds` is hit."""
    if num_groups <= 0 or max_rounds <= 0:
        raise ValueError(f"num_groups and max_rounds must be positive; got {num_groups}, {max_rounds}")
    kept: list[Group] = []
    sampled = dropped = rounds = 0
    while len(kept) < num_groups and rounds < max_rounds:
        batch = sample_groups(num_groups - len(kept))
        rounds += 1
        sampled += len(batch)
        good, bad = filter_informative_groups(batch)
        dropped += bad
        kept.extend(good)
    filled = len(kept) >= num_groups
    if not filled:
        log.info("dynamic sampling: %d/%d informative groups after %d rounds", len(kept), num_groups, rounds)
    return kept[:num_groups], FillStats(rounds, sampled, dropped, filled)
