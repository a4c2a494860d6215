"""The OpenEnv adapter against a real OpenEnv environment server (OpenEnv's create_app under uvicorn, started here
over HTTP/WebSocket on a free port): reset, step, reward and done through the multi-turn token layer."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("openenv.core.generic_client", reason="openenv-core is installed by `make install`")

from forge_core.data.problems import Problem  # noqa: E402
from forge_core.envs import EnvConfig, make_environment  # noqa: E402
from forge_core.envs.episodes import ChatRenderer, env_metrics, finish_episode, run_episodes, start_episodes  # noqa: E402
from forge_core.envs.runner import LocalEnvs  # noqa: E402
from forge_core.generation.sampling import SamplingParams  # noqa: E402
from tests.integration.fault_helpers import ROOT  # noqa: E402
from tests.unit.test_envs import TOK, ScriptedPolicy  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "tests.openenv_server.guess_app:app", "--host",
                             "127.0.0.1", "--port", str(port), "--log-level", "warning"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):  # a liveness guard for the server's start-up, not a speed check
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read().decode()) from None
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_openenv_reset_and_step_over_the_servers_api(server):
    env = make_environment(EnvConfig(name="openenv", options={"url": server, "observation_field": "prompt"}))
    messages, tools = env.reset(Problem("g", "", ""), seed=5)
    assert messages == [{"role": "user", "content": "Guess my number between 1 and 8."}] and tools == []
    results = []
    for guess in range(1, 9):
        results.append(env.step({"role": "assistant", "content": f"I guess {guess}"}))
        if results[-1].done:
            break
    *misses, hit = results
    assert hit.done and hit.reward == 1.0 and all(r.messages[0]["content"] == "higher" for r in misses)
    env.close()


def test_openenv_episodes_through_the_token_layer(server):
    config = EnvConfig(name="openenv", max_turns=8, max_tokens=400,
                       options={"url": server, "observation_field": "prompt"})
    renderer = ChatRenderer(TOK)
    envs = LocalEnvs(config)
    task = Problem("guess", "", "")
    # episode 0 counts up, episode 1 always says 9 (never right): 8 turns, truncated
    runs = start_episodes([(task, 3, 0), (task, 3, 1)], envs, renderer)
    policy = ScriptedPolicy({0: [str(i) for i in range(1, 9)], 1: ["9"] * 8})
    run_episodes(policy, envs, runs, SamplingParams(max_new_tokens=8), seed=0, config=config, renderer=renderer)
    finals = envs.finish([0, 1])
    first, second = [e for r, f in zip(runs, finals, strict=True) for e in finish_episode(r, "", f)]
    assert first.reward == 1.0 and first.completion.metadata["status"] == "completed"
    assert second.reward == 0.0 and second.completion.metadata["status"] == "truncated_turns"
    conversation = first.completion.metadata["conversation"]
    assert [m["content"] for m in conversation if not m["generated"]][1:] == ["higher"] * (first.completion.metadata[
        "turns"] - 1)
    assert env_metrics([first, second])["env/turns_mean"] == (first.completion.metadata["turns"] + 8) / 2
    # the server's secret for seed 3 is 4: three "higher" answers, then the right guess on turn 4
    assert first.completion.metadata["turns"] == 4 and first.completion.text.count("⟦user: higher⟧") == 3
