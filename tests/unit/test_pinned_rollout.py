"""A rollout pinned to a weight version the store no longer has is sampled, but never silently: logged as an
error, stamped on each completion, counted in health and in rollout/pinned_version_misses."""

import logging

from forge_core.recipes.steps import rollout_metrics
from infra.weightsync import FSWeightStore
from tests.integration.pool_helpers import tiny_config, tiny_splits
from workers.generator import GeneratorWorker


def test_missing_pinned_version_is_loud_and_counted(tmp_path, caplog):
    cfg = tiny_config("inline")
    splits = tiny_splits(cfg)
    worker = GeneratorWorker(cfg, store=FSWeightStore(str(tmp_path / "store")), threads=1)
    with caplog.at_level(logging.ERROR):
        groups = worker.rollout(splits.train[:2], splits.train_prompts[:2], 2, seed=0, version=5)
    assert "ROLLOUT NOT PINNED: policy version 5 is not in the weight store" in caplog.text
    assert {e.completion.metadata["pinned_version_missed"] for g in groups for e in g.episodes} == {5}
    assert worker.health()["pinned_version_misses"] == 1
    assert rollout_metrics(groups, 5, 1.0)["rollout/pinned_version_misses"] == 4.0
    exact = worker.rollout(splits.train[:2], splits.train_prompts[:2], 2, seed=0)  # unpinned: nothing to miss
    assert rollout_metrics(exact, 0, 1.0)["rollout/pinned_version_misses"] == 0.0


def test_generator_cuda_graphs_follow_the_config():
    on = GeneratorWorker(tiny_config("inline"), threads=1)
    off = GeneratorWorker(tiny_config("inline", **{"generator.cuda_graphs": False}), threads=1)
    assert on.generator.cuda_graphs is None  # auto: graphs where the model is on CUDA
    assert off.generator.cuda_graphs is False
