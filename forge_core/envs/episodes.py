"""The token layer of multi-turn episodes: token-in, token-out across turns.

Each turn's prompt is the previous turn's ids, plus the ids the model generated, plus the ids of the messages the
environment added, rendered by the chat template and tokenized alone: earlier turns are never tokenized again.
A training sample is the first prompt followed by every later token; its loss mask is 1 exactly on the tokens the
model generated. When the chat template renders the conversation so that it no longer starts with what the model
saw (a template that rewrites earlier turns), the episode starts a new sample from the whole conversation, counted
in env/prefix_breaks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from forge_core.envs.base import STATUSES, TRUNCATIONS, EnvConfig, Message, StepResult
from forge_core.envs.runner import LocalEnvs
from forge_core.generation.sampling import SamplingParams
from forge_core.types import Completion, Episode, Group


class ChatRenderer:
    """Messages → text with the tokenizer's chat template (plain `role: content` lines without one) and text → ids
    without special tokens added (the deltas between turns)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.templated = bool(getattr(tokenizer, "chat_template", None))

    def render(self, messages: list[Message], tools: list[dict], add_generation_prompt: bool) -> str:
        if self.templated:
            return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt)
        end = self.tokenizer.eos_token or ""
        text = "".join(f"{m['role']}: {m.get('content', '')}{end}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")

    def encode(self, text: str) -> list[int]:
        """Token ids of text, no special tokens added (as TorchGenerator.tokenize does for prompts)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def end_of_turn(self, end_ids: Sequence[int]) -> int:
        """The id among `end_ids` that closes an assistant message in this template (what a demonstration ends
        its turns with, so that the rendered conversation extends it)."""
        marker = "\u2063"  # a character no template adds
        text = self.render([{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}], [], False)
        for token in end_ids:
            if text.split(marker, 1)[-1].startswith(self.decode([token])):
                return token
        return end_ids[0]

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of ids (special tokens kept): what the template must reproduce for a prefix to hold."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


@dataclass
class Sample:
    """One training row of an episode: its prompt, then every later token, with the generated ones marked."""

    prompt_text: str
    prompt_ids: list[int]
    first_turn: int = 0  # the episode's turn whose tokens this sample's first generated span holds
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)  # where each generated turn starts in `ids`

    def extend(self, ids: Sequence[int], generated: bool, logprobs: Sequence[float] | None = None) -> None:
        if generated:
            self.turn_starts.append(len(self.ids))
        self.ids += list(ids)
        self.mask += [int(generated)] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


@dataclass
class EpisodeRun:
    """One episode in flight: its environment, conversation, samples and counters."""

    task: Any
    key: int  # sampling stream of this episode (distinct within a step)
    messages: list[Message]
    tools: list[dict]
    samples: list[Sample]
    text: str  # the rendered conversation the current sample's ids stand for
    status: str = ""  # set when the episode ends (one of STATUSES)
    error: str = ""  # what ended it, when the environment said (StepResult.info["error"])
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    reward: float = 0.0
    solved: bool | None = None  # the environment's verdict (StepResult.info["solved"]), None until it gives one
    turn_rewards: list[float] = field(default_factory=list)  # per turn (a turn the environment did not answer: 0)
    turn_versions: list[int] = field(default_factory=list)
    conversation: list[dict] = field(default_factory=list)  # messages with `generated` marks, for samples views

    @property
    def done(self) -> bool:
        return bool(self.status)

    @property
    def sample(self) -> Sample:
        return self.samples[-1]


def start_episodes(items: list[tuple[Any, int, int]], envs, renderer: ChatRenderer) -> list[EpisodeRun]:
    """Reset one environment per (task, env seed, key) and render each opening as the episode's first prompt."""
    openings = envs.reset([(key, task, seed) for task, seed, key in items])
    runs = []
    for (task, _, key), (messages, tools) in zip(items, openings, strict=True):
        text = renderer.render(messages, tools, add_generation_prompt=True)
        run = EpisodeRun(task, key, list(messages), list(tools), [Sample(text, renderer.encode(text))], text)
        run.conversation = [{**m, "generated": False} for m in messages]
        runs.append(run)
    return runs


def record_turn(run: EpisodeRun, completion: Completion, renderer: ChatRenderer, config: EnvConfig,
                end_ids: Sequence[int]) -> list[int] | None:
    """Add one generated turn to the episode; its ids, or None when it ended the episode (cut by a token limit)."""
    ids, logprobs = list(completion.token_ids), list(completion.logprobs)
    budget = config.max_tokens - len(run.sample.ids)
    cut = len(ids) > budget
    ids, logprobs = ids[:budget], logprobs[:budget]
    run.sample.extend(ids, True, logprobs)
    run.turns += 1
    run.turn_versions.append(completion.policy_version)
    ended = bool(ids) and ids[-1] in end_ids and not cut
    content = renderer.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
    message = {"role": "assistant", "content": content}
    run.messages.append(message)
    run.conversation.append({**message, "generated": True})
    if not ended:
        run.status = "truncated_length"
        return None
    return ids


def apply_result(run: EpisodeRun, result: StepResult, generated: list[int], renderer: ChatRenderer,
                 config: EnvConfig) -> None:
    """The environment's answer to the turn: its reward and counts, then the end of the episode or its next
    prompt."""
    reward = float(result.reward or 0.0)
    run.reward += reward
    run.turn_rewards += [0.0] * (run.turns - len(run.turn_rewards))
    run.turn_rewards[-1] += reward
    run.tool_calls += int(result.info.get("tool_calls", 0))
    run.tool_errors += int(result.info.get("tool_errors", 0))
    if "solved" in result.info:
        run.solved = bool(result.info["solved"])
    if result.done:
        status = result.info.get("status", "completed")
        run.status = status if status in STATUSES else "completed"
        run.error = str(result.info.get("error", ""))
        return
    if run.turns >= config.max_turns:
        run.status = "truncated_turns"
        return
    bridge(run, generated, list(result.messages), renderer, config)


def bridge(run: EpisodeRun, generated: list[int], new: list[Message], renderer: ChatRenderer,
           config: EnvConfig) -> None:
    """Append the environment's messages to the current sample as ids (mask 0), or start a new sample when the
    template no longer extends what the model saw (its last prompt, then the `generated` ids)."""
    seen = run.text + renderer.decode(generated)
    run.messages += new
    run.conversation += [{**m, "generated": False} for m in new]
    full = renderer.render(run.messages, run.tools, add_generation_prompt=True)
    if full.startswith(seen):
        delta = renderer.encode(full[len(seen):])
        if len(run.sample.ids) + len(delta) >= config.max_tokens:
            run.status = "truncated_length"
            return
        run.sample.extend(delta, False)
        run.text = full
        return
    # the template rewrote an earlier turn: the conversation so far becomes the prompt of a new sample
    run.samples.append(Sample(full, renderer.encode(full), first_turn=run.turns))
    run.text = full


def returns_to_go(turn_rewards: list[float], turns: int, final_reward: float) -> list[float]:
    """Per turn t < `turns`: the rewards of turns t.. plus the final reward (turn 0's is the episode's return)."""
    rewards = list(turn_rewards) + [0.0] * (turns - len(turn_rewards))
    out, total = [], final_reward
    for r in reversed(rewards):
        total += r
        out.append(total)
    return out[::-1]


def is_solved(run: EpisodeRun, final_reward: float) -> bool:
    """The environment's verdict on the episode, or without one whether its outcome (the reward of its last turn
    plus the final reward) is >= 1.0 (forge_core/envs/base.py)."""
    if run.solved is not None:
        return run.solved
    answered = run.turns > 0 and len(run.turn_rewards) >= run.turns  # a turn cut by max_tokens got no answer
    return (run.turn_rewards[run.turns - 1] if answered else 0.0) + final_reward >= 1.0


def episode_stop_reason(status: str) -> str:
    """Completion.stop_reason of an episode that ended with `status`: "eos" (completed), "length" (cut by
    env.max_turns or env.max_tokens), else the status itself (an error ended it)."""
    if status == "completed":
        return "eos"
    return "length" if status in TRUNCATIONS else status


def finish_episode(run: EpisodeRun, target: str, final_reward: float, credit: str = "episode") -> list[Episode]:
    """The episode's training samples (the first carries the episode; later ones have `continues`). credit="turn":
    each sample's metadata carries the episode's `turn_returns`, its `first_turn` and `turn_starts`, for per-turn
    advantages."""
    solved = is_solved(run, final_reward)
    run.reward += final_reward
    turn_returns = returns_to_go(run.turn_rewards, run.turns, final_reward)
    episodes = []
    first = next((i for i, m in enumerate(run.conversation) if m["generated"]), len(run.conversation))
    text = transcript(run.conversation[first:])  # after the opening messages, which the prompt shows
    for i, s in enumerate(run.samples):
        meta = {"status": run.status, "solved": solved, "turns": run.turns, "tool_calls": run.tool_calls,
                "tool_errors": run.tool_errors, "turn_versions": list(run.turn_versions),
                "samples": len(run.samples), "conversation": run.conversation if i == 0 else []}
        if run.error:
            meta["error"] = run.error
        if credit == "turn":
            meta.update(turn_returns=turn_returns, first_turn=s.first_turn, turn_starts=list(s.turn_starts))
        completion = Completion(text=text if i == 0 else "", token_ids=s.ids, logprobs=s.logprobs, metadata=meta,
                                policy_version=min(run.turn_versions, default=0),
                                stop_reason=episode_stop_reason(run.status), loss_mask=s.mask)
        episodes.append(Episode(s.prompt_text, target, s.prompt_ids, completion, reward=run.reward, continues=i > 0))
    return episodes


def transcript(conversation: list[dict]) -> str:
    """The episode after its opening as people read it: the model's turns as written, what the environment
    inserted (never trained on) in ⟦role: content⟧ marks."""
    return "\n".join(m["content"] if m["generated"] else f"⟦{m['role']}: {m['content']}⟧" for m in conversation)


def run_episodes(generator, envs, runs: list[EpisodeRun], params: SamplingParams, seed: int, config: EnvConfig,
                 renderer: ChatRenderer) -> None:
    """Play every episode to its end: each turn samples the next assistant message of all unfinished episodes in
    one batch (episode i's stream: seed + turn salt, key i), then their environments answer them in one batch."""
    end_ids = list(generator.end_ids)
    for turn in range(config.max_turns):
        live = [r for r in runs if not r.done]
        if not live:
            break
        room = max(config.max_tokens - len(r.sample.ids) for r in live)
        turn_params = replace(params, max_new_tokens=max(1, min(params.max_new_tokens, room)))
        rows = [r.sample.prompt_ids + r.sample.ids for r in live]
        completions = generator.generate([r.text for r in live], n=1, seed=(seed + 1_000_033 * turn) % (2**31 - 1),
                                         params=turn_params, prompt_keys=[r.key for r in live], prompt_ids=rows)
        turns = [(run, record_turn(run, completion, renderer, config, end_ids))
                 for run, (completion,) in zip(live, completions, strict=True)]
        turns = [(run, ids) for run, ids in turns if ids is not None]
        results = envs.step([(run.key, run.messages[-1]) for run, _ in turns]) if turns else []
        for (run, ids), result in zip(turns, results, strict=True):
            apply_result(run, result, ids, renderer, config)
    for r in runs:
        if not r.done:
            r.status = "truncated_turns"


class ScriptedTurns:
    """A generator that answers each episode's turns from a script (texts, one per turn, in episode-key order):
    demonstrations played through the same token layer as the model's own episodes."""

    def __init__(self, tokenizer, end_ids: Sequence[int], scripts: dict[int, list[str]], version: int = 0):
        self.tokenizer, self.end_ids, self.scripts, self.version = tokenizer, list(end_ids), scripts, version
        self.end_of_turn = ChatRenderer(tokenizer).end_of_turn(self.end_ids)
        self.turns: dict[int, int] = {}

    def generate(self, prompts, n=1, seed=None, params=None, prompt_keys=None, prompt_ids=None):
        out = []
        for key in prompt_keys:
            turn = self.turns.get(key, 0)
            self.turns[key] = turn + 1
            text = self.scripts[key][turn] if turn < len(self.scripts[key]) else ""
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.end_of_turn]
            out.append([Completion(text, ids, [0.0] * len(ids), policy_version=self.version, stop_reason="eos")])
        return out


def sample_env_groups(generator, problems: Sequence[Any], group_size: int, seed: int, params: SamplingParams,
                      config: EnvConfig, prompt_keys: Sequence[int] | None = None, envs=None) -> list[Group]:
    """`group_size` episodes of `config`'s environment per problem, played in one batch; episode j of the problem
    with key k samples from stream k * group_size + j and every episode of a group resets with the same seed, so a
    group compares G attempts at one task (whichever replica plays it). `envs`: where the environments run
    (default: LocalEnvs, in this process, closed at the end)."""
    if envs is None:
        with LocalEnvs(config) as own:
            return sample_env_groups(generator, problems, group_size, seed, params, config, prompt_keys, own)
    renderer = ChatRenderer(generator.tokenizer)
    keys = list(range(len(problems))) if prompt_keys is None else list(prompt_keys)
    runs = start_episodes([(problem, (seed + key) % (2**31 - 1), key * group_size + j)
                           for problem, key in zip(problems, keys, strict=True) for j in range(group_size)],
                          envs, renderer)
    run_episodes(generator, envs, runs, params, seed, config, renderer)
    finals = envs.finish([r.key for r in runs])
    groups = []
    for p, problem in enumerate(problems):
        span = range(p * group_size, (p + 1) * group_size)
        episodes = [e for i in span for e in finish_episode(runs[i], problem.target, finals[i], config.credit)]
        groups.append(Group(episodes[0].prompt, problem.target, episodes, question=problem.question))
    return groups


def env_metrics(episodes: list[Episode]) -> dict[str, float]:
    """env/solved, env/turns_mean, env/tool_calls_mean, env/tool_errors, env/prefix_breaks and env/status_<s>
    (fractions) over the episodes (continuation samples counted once, as their episode)."""
    heads = [e for e in episodes if not e.continues and "status" in e.completion.metadata]
    if not heads:
        return {}
    n = len(heads)
    meta = [e.completion.metadata for e in heads]
    out = {"env/solved": sum(bool(m["solved"]) for m in meta) / n,
           "env/turns_mean": sum(m["turns"] for m in meta) / n,
           "env/tool_calls_mean": sum(m["tool_calls"] for m in meta) / n,
           "env/tool_errors": float(sum(m["tool_errors"] for m in meta)),
           "env/prefix_breaks": float(sum(m["samples"] - 1 for m in meta))}
    for status in STATUSES:
        out[f"env/status_{status}"] = sum(m["status"] == status for m in meta) / n
    return out
