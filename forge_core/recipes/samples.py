"""Rollout samples people read: a few prompts of a step's batch with every completion, its reward and advantage.

The flow records them at each eval step (MLflow table, Prefect markdown artifact, `<run>/samples/step-N.json`);
`forgeflow samples RUN` prints them.
"""

from __future__ import annotations

from forge_core.advantages import group_advantages
from forge_core.types import Group

SAMPLE_COLUMNS = ("step", "question", "prompt", "completion", "target", "reward", "advantage", "policy_version", "stop_reason")


def sample_rows(groups: list[Group], step: int, prompts: int, advantage: dict | None = None) -> list[dict]:
    """One row per completion of the first `prompts` groups (columns SAMPLE_COLUMNS); advantages recomputed from
    the rewards with the run's estimator (`advantage`: {name: …, …}; the trainer's copies stay on its worker)."""
    chosen = [g for g in groups if g.episodes][:max(0, prompts)]
    if not chosen:
        return []
    options = dict(advantage or {"name": "grpo"})
    advantages = group_advantages(chosen, options.pop("name"), **options)
    episodes = [e for g in chosen for e in g.episodes]
    questions = [g.question or g.prompt for g in chosen for _ in g.episodes]
    return [{"step": step, "question": q, "prompt": e.prompt, "completion": e.completion.text, "target": e.target,
             "reward": float(e.reward), "advantage": float(a), "policy_version": int(e.completion.policy_version),
             "stop_reason": e.completion.stop_reason, **conversation_of(e)}
            for q, e, a in zip(questions, episodes, advantages, strict=True)]


def conversation_of(episode) -> dict:
    """A multi-turn episode's messages with roles, tool calls and results, each marked `generated` (trained on)
    or not (inserted by the environment, loss-masked), plus how it ended; {} for a single-turn completion."""
    meta = episode.completion.metadata
    if "conversation" not in meta:
        return {}
    return {"conversation": meta["conversation"], "status": meta["status"], "turns": meta["turns"]}


def samples_markdown(rows: list[dict], max_chars: int = 400) -> str:
    """The rows as markdown: one section per prompt, a table of its completions (text cut to `max_chars`)."""
    if not rows:
        return "_no samples_"
    lines: list[str] = []
    prompt = None
    for r in rows:
        if r["prompt"] != prompt:
            prompt = r["prompt"]
            target = clip(str(r["target"]), max_chars).replace("\n", " ⏎ ")
            question = clip(str(r.get("question") or prompt), max_chars).replace("\n", " ⏎ ")
            lines += ["", f"**Question**: {question} (target `{target}`)", ""]
            if question != prompt:  # the whole prompt (system turn, template) after the question, not before it
                lines += ["<sub>as prompted:</sub>", "", "```", clip(prompt, max_chars), "```", ""]
            lines += ["| reward | advantage | completion |", "|---:|---:|---|"]
        text = clip(r["completion"], max_chars).replace("|", "\\|").replace("\n", " ⏎ ")
        lines.append(f"| {r['reward']:.3f} | {r['advantage']:+.3f} | {text} |")
    return "\n".join(lines).strip() + "\n"


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"
