"""How workers/remote merges the replicas' answers: split evaluation counts like one generator."""

from types import SimpleNamespace

from workers.remote import remote_evaluate


class CountingPool:
    """A pool of `replicas` generators whose evaluate marks a prompt correct when its problem is even (sampled: two
    of three samples of a problem divisible by 3 are correct); it records each replica's shard."""

    def __init__(self, replicas: int):
        self.replicas, self.shards = replicas, {}

    def clients(self, role):
        return [object()] * self.replicas

    def call_each(self, role, method, shards):
        self.shards = shards
        out = {}
        for i, (problems, _prompts, samples, _keys) in shards.items():
            out[i] = {"eval/accuracy": sum(p.n % 2 == 0 for p in problems) / len(problems),
                      "eval/sampled_accuracy": sum(2 * (p.n % 3 == 0) for p in problems) / (len(problems) * samples),
                      f"eval/pass_at_{samples}": sum(p.n % 3 == 0 for p in problems) / len(problems)}
        return out


def test_split_evaluation_sums_counts_not_means():
    problems = [SimpleNamespace(n=n) for n in range(11)]
    prompts = [str(n) for n in range(11)]
    for replicas in (1, 3, 20):
        pool = CountingPool(replicas)
        metrics = remote_evaluate(pool, problems, prompts, samples=3)
        assert metrics["eval/accuracy"] == 6 / 11  # 0, 2, 4, 6, 8, 10
        assert metrics["eval/sampled_accuracy"] == 8 / 33  # 0, 3, 6, 9: two of three each
        assert metrics["eval/pass_at_3"] == 4 / 11  # the same four prompts have a correct sample
        assert len(pool.shards) == min(replicas, 11)
        assert [k for shard in pool.shards.values() for k in shard[3]] == [
            k for i in range(min(replicas, 11)) for k in range(i, 11, replicas)]  # each prompt keeps its index


def test_pass_at_k_counts_prompts_with_any_correct_sample():
    from forge_core.recipes.steps import pass_at_k

    hits = [[False, True, False], [False] * 3, [True] * 3, [False, False, True]]
    assert pass_at_k(hits) == 3 / 4  # by hand: prompts 0, 2 and 3
    assert pass_at_k([[False]]) == 0.0 and pass_at_k([]) == 0.0
