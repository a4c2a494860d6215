"""Environments and the multi-turn token layer: ids, loss masks, statuses, prefix breaks."""

from __future__ import annotations

import threading

import pytest

from forge_core.data.problems import Problem
from forge_core.envs import CalculatorEnvironment, EnvConfig, GuessEnvironment, StepResult
from forge_core.envs.calculator import calculate, evaluate_arithmetic
from forge_core.envs.episodes import ChatRenderer, env_metrics
from forge_core.envs.tool_calls import ToolCallError, format_tool_call, parse_tool_calls
from forge_core.envs.tools import ToolError
from forge_core.models.tokenizer import build_char_tokenizer, end_token_ids
from forge_core.types import Completion

TOK = build_char_tokenizer()
END = TOK.convert_tokens_to_ids("<|im_end|>")
PRODUCT = Problem("What is 47*38?", "47*38=1786\n#### 1786", "1786")


class ScriptedPolicy:
    """A stand-in for the generator in token-layer tests: episode `key` answers its turns from a script (text), so
    the test knows exactly which ids the model generated."""

    def __init__(self, scripts: dict[int, list[str]], version: int = 3):
        self.scripts, self.version = scripts, version
        self.end_ids = end_token_ids(TOK, None)
        self.seen_prompts: dict[int, list[list[int]]] = {}

    def generate(self, prompts, n, seed, params, prompt_keys, prompt_ids):
        out = []
        for key, row in zip(prompt_keys, prompt_ids, strict=True):
            turns = self.seen_prompts.setdefault(key, [])
            turns.append(list(row))
            text = self.scripts[key][len(turns) - 1]
            ids = TOK(text, add_special_tokens=False)["input_ids"] + [END]
            ids = ids[:params.max_new_tokens]
            out.append([Completion(text, ids, [-0.5] * len(ids), policy_version=self.version,
                                   stop_reason="eos" if ids[-1] == END else "length")])
        return out


def play(envs, scripts, config=None, tasks=None, tokenizer=TOK):
    """Play one episode per environment (episode i: envs[i], scripts[i]) through the token layer."""
    from forge_core.envs.episodes import finish_episode, run_episodes, start_episodes
    from forge_core.envs.runner import LocalEnvs
    from forge_core.generation.sampling import SamplingParams

    config = config or EnvConfig(name="calculator", max_turns=4, max_tokens=400, step_timeout_s=0.5)
    renderer = ChatRenderer(tokenizer)
    local = LocalEnvs(config, make=lambda key: envs[key])
    runs = start_episodes([((tasks or [PRODUCT] * len(envs))[i], 7, i) for i in range(len(envs))], local, renderer)
    policy = ScriptedPolicy(scripts)
    run_episodes(policy, local, runs, SamplingParams(max_new_tokens=80), seed=11, config=config, renderer=renderer)
    finals = local.finish([r.key for r in runs])
    return runs, policy, [e for r, f in zip(runs, finals, strict=True) for e in finish_episode(r, PRODUCT.target, f, config.credit)]


CALL = format_tool_call("calculate", expression="47*38")


def test_tool_calls_parse_and_refuse_malformed_json_or_open_tags():
    assert parse_tool_calls(f"let me compute {CALL}")[0].arguments == {"expression": "47*38"}
    assert parse_tool_calls("#### 1786") == []
    with pytest.raises(ToolCallError, match="not JSON"):
        parse_tool_calls('<tool_call>{"name": "calculate", </tool_call>')
    with pytest.raises(ToolCallError, match="not closed"):
        parse_tool_calls('<tool_call>{"name": "calculate"}')


def test_calculator_evaluates_arithmetic_and_never_runs_code():
    assert calculate("47*38") == "1786" and calculate("(3+4)/2") == "3.5"
    for hostile in ("__import__('os').system('true')", "open('/etc/passwd')", "2**10", "9" * 300):
        with pytest.raises(ToolError):
            evaluate_arithmetic(hostile)
    with pytest.raises(ToolError, match="division by zero"):
        evaluate_arithmetic("1/0")


def test_episode_ids_are_the_generated_and_inserted_ids_and_the_mask_marks_exactly_the_generated():
    runs, policy, episodes = play([CalculatorEnvironment()], {0: [CALL, "#### 1786"]})
    (episode,) = episodes
    comp = episode.completion
    assert episode.reward == 1.0 and comp.metadata["status"] == "completed" and comp.metadata["turns"] == 2
    # the second turn was sampled from exactly the first prompt + what was generated + what the env inserted
    first, second = policy.seen_prompts[0]
    assert first == episode.prompt_ids
    gen1 = TOK(CALL, add_special_tokens=False)["input_ids"] + [END]
    inserted = second[len(first) + len(gen1):]
    gen2 = TOK("#### 1786", add_special_tokens=False)["input_ids"] + [END]
    assert second[:len(first) + len(gen1)] == first + gen1
    assert comp.token_ids == gen1 + inserted + gen2
    assert comp.loss_mask == [1] * len(gen1) + [0] * len(inserted) + [1] * len(gen2)
    assert TOK.decode(inserted) == "\n<|im_start|>tool\n1786<|im_end|>\n<|im_start|>assistant\n"
    assert comp.logprobs == [-0.5] * len(gen1) + [0.0] * len(inserted) + [-0.5] * len(gen2)
    assert comp.metadata["turn_versions"] == [3, 3] and comp.policy_version == 3
    # the whole conversation rendered and tokenized at once gives the same ids (the char tokenizer is context-free)
    rendered = TOK.apply_chat_template(runs[0].messages, tokenize=False)
    assert TOK(rendered, add_special_tokens=False)["input_ids"][:-1] == episode.prompt_ids + comp.token_ids
    roles = [(m["role"], m["generated"]) for m in comp.metadata["conversation"]]
    assert roles == [("user", False), ("assistant", True), ("tool", False), ("assistant", True)]


class CrashingEnv(CalculatorEnvironment):
    def step(self, message):
        raise RuntimeError("the environment broke")


class HangingEnv(CalculatorEnvironment):
    """Its step blocks until the test releases it."""

    def __init__(self):
        super().__init__()
        self.release, self.returned = threading.Event(), threading.Event()

    def step(self, message):
        self.release.wait(60)
        self.returned.set()
        return StepResult(done=True)


def test_each_failure_ends_its_own_episode_with_its_status_and_the_others_complete():
    hanging = HangingEnv()
    envs = [CrashingEnv(), hanging, CalculatorEnvironment(), CalculatorEnvironment(), CalculatorEnvironment(),
            CalculatorEnvironment()]
    scripts = {0: [CALL], 1: [CALL], 2: ['<tool_call>{"name": "calculate", "arguments": </tool_call>'],
               3: [format_tool_call("search", query="x")], 4: [CALL] * 4, 5: [CALL, "#### 1786"]}
    runs, _, episodes = play(envs, scripts, EnvConfig(name="calculator", max_turns=3, max_tokens=800,
                                                      step_timeout_s=0.3))
    statuses = [e.completion.metadata["status"] for e in episodes]
    assert statuses == ["error", "timeout", "parse_error", "unknown_tool", "truncated_turns", "completed"]
    assert [e.reward for e in episodes] == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert not hanging.returned.is_set()  # the hung step was abandoned, not waited for
    hanging.release.set()
    metrics = env_metrics(episodes)
    assert metrics["env/status_completed"] == pytest.approx(1 / 6)
    assert metrics["env/status_truncated_turns"] == pytest.approx(1 / 6)
    # tool calls are counted by the environment that ran them: none for the crash, the hang and the parse error
    assert metrics["env/tool_calls_mean"] == pytest.approx((0 + 0 + 0 + 1 + 3 + 1) / 6)
    assert metrics["env/turns_mean"] == pytest.approx((1 + 1 + 1 + 1 + 3 + 2) / 6)


def test_a_tool_error_goes_back_to_the_model_and_is_counted():
    bad = format_tool_call("calculate", expression="1/0")
    _, _, (episode,) = play([CalculatorEnvironment()], {0: [bad, "#### 1786"]})
    meta = episode.completion.metadata
    assert meta["status"] == "completed" and meta["tool_errors"] == 1
    assert meta["conversation"][2]["content"] == "error: division by zero"
    assert env_metrics([episode])["env/tool_errors"] == 1.0


def test_the_token_budget_truncates_an_episode():
    config = EnvConfig(name="calculator", max_turns=4, max_tokens=30, step_timeout_s=1)
    _, _, (episode,) = play([CalculatorEnvironment()], {0: [CALL]}, config)
    assert episode.completion.metadata["status"] == "truncated_length"
    assert len(episode.completion.token_ids) <= 30 and all(episode.completion.loss_mask)


def test_a_template_that_rewrites_earlier_turns_starts_a_new_sample():
    tok = build_char_tokenizer()
    # drops the content of every assistant turn but the last: the next prompt no longer extends what was sampled
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}…{% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    _, _, episodes = play([CalculatorEnvironment()], {0: [CALL, "#### 1786"]}, tokenizer=tok)
    first, second = episodes
    assert not first.continues and second.continues
    assert all(first.completion.loss_mask) and all(second.completion.loss_mask)  # nothing inserted in either
    assert "<|im_start|>tool\n1786" in second.prompt and second.reward == first.reward == 1.0
    assert env_metrics(episodes)["env/prefix_breaks"] == 1.0


def test_guess_gives_feedback_until_the_number_is_found():
    env = GuessEnvironment(low=1, high=8)
    messages, tools = env.reset(Problem("g", "", ""), seed=3)
    assert tools == [] and "between 1 and 8" in messages[0]["content"]
    answers = [env.step({"role": "assistant", "content": str(g)}) for g in range(1, 9)]
    hits = [i for i, a in enumerate(answers) if a.done]
    assert hits == [env.secret - 1]
    assert all(a.messages[0]["content"] == "higher" for a in answers[:env.secret - 1])
    assert env.final_reward() == 1.0


def test_demonstrations_are_played_through_the_token_layer_and_teach_only_the_assistant_turns():
    from forge_core.recipes.sft import make_env_sft_examples, sft_batch

    problems = [PRODUCT, Problem("12*11=", "12*11=132\n#### 132", "132")]
    config = EnvConfig(name="calculator", max_turns=3, max_tokens=200)
    with_tool, alone = make_env_sft_examples(problems, config, TOK, end_token_ids(TOK, None), tool_use=1.0), \
        make_env_sft_examples(problems, config, TOK, end_token_ids(TOK, None), tool_use=0.0)
    text = TOK.decode(with_tool[0].response_ids)
    assert text == (f"{CALL}<|im_end|>\n<|im_start|>tool\n1786<|im_end|>\n<|im_start|>assistant\n#### 1786<|im_end|>")
    taught = TOK.decode([t for t, m in zip(with_tool[0].response_ids, with_tool[0].loss_mask, strict=True) if m])
    assert taught == f"{CALL}<|im_end|>#### 1786<|im_end|>"
    assert TOK.decode(alone[1].response_ids) == "#### 132<|im_end|>" and all(alone[1].loss_mask)
    _, targets = sft_batch(with_tool, pad_id=TOK.pad_token_id)
    assert targets["loss_mask"].sum() == sum(sum(e.loss_mask) for e in with_tool)


class FlakyToolEnv(CalculatorEnvironment):
    """A calculator whose step raises once the tool has answered (a bug in the environment)."""

    def step(self, message):
        if "####" in message.get("content", ""):
            raise KeyError("the bug")
        return super().step(message)


def test_a_demonstration_the_environment_broke_names_the_exception(monkeypatch):
    from forge_core.envs import ENVIRONMENTS
    from forge_core.recipes.sft import make_env_sft_examples

    monkeypatch.setitem(ENVIRONMENTS, "flaky", FlakyToolEnv)
    config = EnvConfig(name="flaky", max_turns=3, max_tokens=200)
    with pytest.raises(ValueError, match=r"'What is 47\*38\?' did not complete as one sample \(error: KeyError: 'the bug'\)"):
        make_env_sft_examples([PRODUCT], config, TOK, end_token_ids(TOK, None), tool_use=1.0)


def test_samples_show_the_conversation_with_the_inserted_spans_marked():
    from forge_core.recipes.samples import sample_rows, samples_markdown
    from forge_core.types import Group

    _, _, episodes = play([CalculatorEnvironment(), CalculatorEnvironment()], {0: [CALL, "#### 1786"], 1: ["#### 5"]})
    rows = sample_rows([Group(episodes[0].prompt, "1786", episodes, question=PRODUCT.question)], step=1, prompts=1)
    assert rows[0]["completion"] == f"{CALL}\n⟦tool: 1786⟧\n#### 1786"
    assert [m["generated"] for m in rows[0]["conversation"]] == [False, True, False, True]
    assert rows[0]["status"] == "completed" and rows[1]["turns"] == 1
    assert "⟦tool: 1786⟧" in samples_markdown(rows)


def test_dynamic_sampling_keeps_the_environments_rewards():
    from forge_core.recipes.steps import round_scorer
    from forge_core.types import Group

    _, _, episodes = play([CalculatorEnvironment(), CalculatorEnvironment()], {0: [CALL, "#### 1786"], 1: ["#### 5"]})
    groups = [Group("p", "1786", episodes)]

    def rescore(groups):
        raise AssertionError("an environment's episodes were scored again by the reward functions")

    assert round_scorer(False, True, rescore) is None
    scored, metrics = round_scorer(True, True, rescore)(groups)
    assert [e.reward for e in scored[0].episodes] == [1.0, 0.0] and metrics["reward/mean"] == 0.5


def test_digit_credit_rewards_near_misses_below_an_exact_answer():
    env = CalculatorEnvironment(digit_credit=0.5)
    env.reset(PRODUCT, seed=0)
    assert env.answer("#### 1786") == 1.0 and env.answer("#### 1776") == 0.375 and env.answer("no number") == 0.0
    with pytest.raises(ValueError, match="digit_credit must be in"):
        CalculatorEnvironment(digit_credit=1.0)


# a template that renders tools, as Qwen's and Llama's do: a tool it is given is shown to the model
TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t['function']['name'] }}: "
                  "{{ t['function']['description'] }}\n{% endfor %}<|im_end|>\n{% endif %}") + TOK.chat_template


def opening_prompt(env, template=TOOLS_TEMPLATE):
    """The first prompt of an episode in `env`, rendered by the token layer with a tool-aware template."""
    from forge_core.envs.episodes import start_episodes
    from forge_core.envs.runner import LocalEnvs

    tok = build_char_tokenizer()
    tok.chat_template = template
    local = LocalEnvs(EnvConfig(name="calculator"), make=lambda key: env)
    (run,) = start_episodes([(PRODUCT, 7, 0)], local, ChatRenderer(tok))
    local.finish([0])
    return run


def test_without_the_tool_no_schema_reaches_the_prompt():
    with_tool, alone = opening_prompt(CalculatorEnvironment()), opening_prompt(CalculatorEnvironment(allow_tools=False))
    assert [s["function"]["name"] for s in with_tool.tools] == ["calculate"] and "calculate" in with_tool.text
    assert alone.tools == [] and "calculate" not in alone.text and "Tools" not in alone.text
    assert alone.text.endswith("<|im_start|>user\nWhat is 47*38?<|im_end|>\n<|im_start|>assistant\n")


def test_the_tool_prompt_is_shown_only_with_the_tool():
    howto = f"To use the calculator write {CALL}"
    with_tool = opening_prompt(CalculatorEnvironment(system_prompt="Be brief.", tool_prompt=howto))
    alone = opening_prompt(CalculatorEnvironment(system_prompt="Be brief.", tool_prompt=howto, allow_tools=False))
    assert with_tool.messages[0] == {"role": "system", "content": f"{howto}\nBe brief."}
    assert alone.messages[0] == {"role": "system", "content": "Be brief."}
    assert "<tool_call>" not in alone.text and "calculate" not in alone.text


@pytest.mark.parametrize("expression", ["1e999", "1e999-1e999", "-1e999", "-(1e12*10)", "1e13", "2*(0-1e999)"])
def test_the_calculator_refuses_values_out_of_range_rather_than_answer_inf_or_nan(expression):
    with pytest.raises(ToolError, match="exceeds"):
        calculate(expression)


def test_an_out_of_range_value_goes_back_to_the_model_as_an_error():
    env = CalculatorEnvironment()
    env.reset(PRODUCT, seed=0)
    result = env.step({"role": "assistant", "content": format_tool_call("calculate", expression="1e999-1e999")})
    assert not result.done and result.info["tool_errors"] == 1
    assert result.messages[0]["content"].startswith("error: ") and "nan" not in result.messages[0]["content"]


def test_the_built_in_environments_give_their_verdict_when_an_episode_ends():
    env = CalculatorEnvironment(digit_credit=0.5)
    env.reset(PRODUCT, seed=0)
    right, near = env.step({"content": "#### 1786"}), env.step({"content": "#### 1776"})
    assert (right.reward, right.info["solved"]) == (1.0, True) and (near.reward, near.info["solved"]) == (0.375, False)
    refused = CalculatorEnvironment(allow_tools=False)
    refused.reset(PRODUCT, seed=0)
    assert refused.step({"content": CALL}).info == {"status": "unknown_tool", "solved": False, "tool_calls": 1,
                                                   "error": "unknown tool 'calculate'; tools: []"}
    guess = GuessEnvironment(low=1, high=8, step_cost=0.1)
    guess.reset(Problem("g", "", ""), seed=3)
    assert guess.step({"content": str(guess.secret)}).info["solved"] is True


class BuggyEnv(CalculatorEnvironment):
    """Its constructor has a bug that raises TypeError, whatever the options."""

    def __init__(self, digit_credit: float = 0.0):
        super().__init__(digit_credit=digit_credit)
        len(None)  # the bug


def test_options_that_do_not_fit_the_constructor_are_a_config_error(monkeypatch):
    from forge_core.envs import ENVIRONMENTS, make_environment

    with pytest.raises(ValueError, match=r"env.options \['digit_creidt'\] do not fit env.name 'calculator'"):
        make_environment(EnvConfig(name="calculator", options={"digit_creidt": 0.5}))
    with pytest.raises(ValueError, match="do not fit env.name 'openenv'.*missing a required argument: 'url'"):
        make_environment(EnvConfig(name="openenv", options={"action_field": "message"}))
    monkeypatch.setitem(ENVIRONMENTS, "buggy", BuggyEnv)
    with pytest.raises(ValueError, match="do not fit env.name 'buggy'"):
        make_environment(EnvConfig(name="buggy", options={"low": 1}))


def test_a_type_error_inside_a_constructor_surfaces_as_itself(monkeypatch):
    from forge_core.envs import ENVIRONMENTS, make_environment

    monkeypatch.setitem(ENVIRONMENTS, "buggy", BuggyEnv)
    with pytest.raises(TypeError, match="has no len"):
        make_environment(EnvConfig(name="buggy", options={"digit_credit": 0.5}))
