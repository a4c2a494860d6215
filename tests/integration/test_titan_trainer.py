"""trainer.backend: titan (torchtitan models, 2 ranks over gloo) trains like the HF backend on the same weights and
batch, and publishes HF-layout weights that the generator loads."""

import pytest
import torch

from forge_core.generation import TorchGenerator
from forge_core.models import load_model_and_tokenizer, save_model_and_tokenizer
from forge_core.recipes import steps
from infra.weightsync import FSWeightStore
from tests.integration.pool_helpers import tiny_config, tiny_splits
from workers.pool import WorkerPool

pytestmark = pytest.mark.integration

SETTINGS = {"trainer.lr": 1e-3, "trainer.max_norm": 0.5, "trainer.micro_batch_size": 8}


def scored_groups(cfg, model, tok):
    """Rollouts of the untrained model with alternating rewards: every group informative, uneven token counts."""
    splits = tiny_splits(cfg)
    groups = steps.rollout(TorchGenerator(model, tok), splits.train[:8], splits.train_prompts[:8], 4, seed=0)
    for g in groups:
        for i, e in enumerate(g.episodes):
            e.reward = float(i % 2)
    return groups


def train_two_steps(cfg, root, groups):
    """(metrics of steps 0 and 1, HF-layout weights published as version 2, checkpoint dir)."""
    with WorkerPool(cfg, root, roles=("trainer",)) as pool:
        metrics = [pool.call("trainer", "train", step, groups) for step in (0, 1)]
        pool.call("trainer", "save_checkpoint", str(root / "ckpt"))
        return metrics, FSWeightStore(pool.store_root).fetch(2)[1], root / "ckpt"


def assert_same_training(a, b):
    for step in (0, 1):  # step 1 also checks the optimizer update of step 0
        assert a[0][step]["loss/loss"] == pytest.approx(b[0][step]["loss/loss"], abs=1e-4)
        assert a[0][step]["loss/grad_norm"] == pytest.approx(b[0][step]["loss/grad_norm"], rel=1e-4)
    assert a[0][0]["loss/grad_norm"] > 0.5  # clipping was active
    # the weights moved: the same batch gives another gradient (its loss value is ~0 both times: an on-policy step's
    # ratio is π/sg(π) = 1 and the group advantages sum to zero)
    assert a[0][1]["loss/grad_norm"] != a[0][0]["loss/grad_norm"]
    assert a[0][1]["loss/entropy"] != a[0][0]["loss/entropy"]
    assert set(a[1]) == set(b[1])
    assert max((a[1][k] - b[1][k]).abs().max().item() for k in a[1]) < 1e-4


def test_titan_fsdp_two_ranks_match_hf_backend_and_publish_hf_weights(tmp_path):
    cfg = {b: tiny_config("local", **SETTINGS, **{"trainer.procs": 2, "trainer.backend": b}) for b in ("hf", "titan")}
    model, tok = load_model_and_tokenizer(cfg["hf"].model.path, seed=0)
    groups = scored_groups(cfg["hf"], model, tok)
    hf, titan = (train_two_steps(cfg[b], tmp_path / b, groups) for b in ("hf", "titan"))
    assert_same_training(hf, titan)
    # the published weights are HF layout: the generator's model loads them strictly and samples as with hf's
    samples = {}
    for name, weights in (("hf", hf[1]), ("titan", titan[1])):
        gen_model, _ = load_model_and_tokenizer(cfg["hf"].model.path, seed=1)
        gen_model.load_state_dict(weights, strict=True)
        samples[name] = [c.token_ids for per_prompt in TorchGenerator(gen_model, tok).generate(["1+2=", "3+4="], 2, seed=7)
                         for c in per_prompt]
    assert samples["titan"] == samples["hf"]
    # the checkpoint's hf/ directory opens with transformers
    reloaded, _ = load_model_and_tokenizer(str(titan[2] / "hf"))
    assert torch.equal(reloaded.state_dict()["model.norm.weight"], titan[1]["model.norm.weight"])


def untied_model(tmp_path):
    """(path, model, tokenizer) of a tiny Qwen3 with untied embeddings (TP and PP refuse tied ones)."""
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    model.config.tie_word_embeddings = False
    with torch.random.fork_rng():
        torch.manual_seed(0)
        untied = type(model)(model.config)
    return save_model_and_tokenizer(untied, tok, tmp_path / "untied"), untied, tok


def test_titan_tensor_parallel_matches_hf_backend(tmp_path):
    path, untied, tok = untied_model(tmp_path)
    cfg = {b: tiny_config("local", **SETTINGS, **{"model.path": str(path), "trainer.procs": 2, "trainer.backend": b,
                                                   "trainer.tensor_parallel_degree": 2 if b == "titan" else 1})
           for b in ("hf", "titan")}
    groups = scored_groups(cfg["hf"], untied, tok)
    assert_same_training(*(train_two_steps(cfg[b], tmp_path / b, groups) for b in ("hf", "titan")))


# two stages alone are covered by pp2-fsdp2 (two stages × two FSDP ranks, one optimizer step a batch) and by
# pp2-2mini-tis (two stages, mini-batches and TIS)
@pytest.mark.parametrize("procs, update", [(4, {}), (2, {"trainer.mini_batches": 2, "rollout_correction.mode": "tis"})],
                         ids=["pp2-fsdp2", "pp2-2mini-tis"])
def test_titan_pipeline_stages_match_hf_backend_and_checkpoint_reshards(tmp_path, procs, update):
    # step 1 trains the batch sampled by version 0 again (stale): both score the proximal policy (the stages with a
    # forward-only pass) and clip against it; with TIS they weigh by proximal / behaviour
    path, untied, tok = untied_model(tmp_path)
    common = {**SETTINGS, **update, "model.path": str(path), "trainer.procs": 2, "trainer.micro_batch_size": 5}
    hf_cfg = tiny_config("local", **common)
    pp_cfg = tiny_config("local", **{**common, "trainer.backend": "titan", "trainer.pipeline_parallel_degree": 2,
                                     "trainer.procs": procs})  # 4: FSDP over 2 ranks inside each stage
    groups = scored_groups(hf_cfg, untied, tok)  # 32 episodes; pp2: 7 micro-batches of 5 rows, 3 rows padding
    hf, pp = train_two_steps(hf_cfg, tmp_path / "hf", groups), train_two_steps(pp_cfg, tmp_path / "pp", groups)
    assert_same_training(hf, pp)
    # the second step's batch has the first's shape: its GPipe schedule is the one built then
    assert pp[0][0]["loss/pipeline_schedules_built"] == pp[0][1]["loss/pipeline_schedules_built"] == 1.0
    assert pp[0][0]["loss/entropy"] == pytest.approx(hf[0][0]["loss/entropy"], rel=1e-5)  # from the last stage
    shared = {k for k in hf[0][1] if k.startswith(("rollout/behaviour", "rollout/is_"))}
    assert "rollout/behaviour_kl_k3" in shared and ("rollout/is_weight_mean" in shared) == bool(update)
    assert shared == {k for k in pp[0][1] if k.startswith(("rollout/behaviour", "rollout/is_"))}
    assert {k: pp[0][1][k] for k in shared} == pytest.approx({k: hf[0][1][k] for k in shared}, rel=1e-4, abs=1e-7)
    # the stages' checkpoint keys are the whole model's: an FSDP titan trainer resumes from it
    fsdp_cfg = tiny_config("local", **common, **{"trainer.backend": "titan"})
    with WorkerPool(fsdp_cfg, tmp_path / "fsdp", roles=("trainer",)) as pool:
        assert pool.call("trainer", "load_checkpoint", str(pp[2])) == 2
        pool.call("trainer", "publish_weights", 2)
        resumed = FSWeightStore(pool.store_root).fetch(2)[1]
    assert all(torch.equal(resumed[k], pp[1][k]) for k in pp[1])


def test_titan_pipeline_refuses_tied_embeddings(tmp_path):
    cfg = tiny_config("local", **{"trainer.procs": 2, "trainer.backend": "titan",
                                  "trainer.pipeline_parallel_degree": 2})
    with pytest.raises(Exception, match="untied embeddings"):
        with WorkerPool(cfg, tmp_path, roles=("trainer",)):
            pass


def test_titan_tensor_parallel_refuses_tied_embeddings(tmp_path):
    cfg = tiny_config("local", **{"trainer.procs": 2, "trainer.backend": "titan", "trainer.tensor_parallel_degree": 2})
    with pytest.raises(Exception, match="untied embeddings"):
        with WorkerPool(cfg, tmp_path, roles=("trainer",)):
            pass


@pytest.mark.parametrize("backend", ["hf", "titan"])
def test_two_rank_sharded_checkpoint_resumes_exactly(tmp_path, backend):
    cfg = tiny_config("local", **SETTINGS, **{"trainer.procs": 2, "trainer.backend": backend})
    model, tok = load_model_and_tokenizer(cfg.model.path, seed=0)
    groups = scored_groups(cfg, model, tok)
    ckpt = tmp_path / "step-1"
    with WorkerPool(cfg, tmp_path / "a", roles=("trainer",)) as pool:
        pool.call("trainer", "train", 0, groups)
        pool.call("trainer", "save_checkpoint", str(ckpt))
        straight = pool.call("trainer", "train", 1, groups)
        straight_weights = FSWeightStore(pool.store_root).fetch(2)[1]
    assert sorted(p.name for p in (ckpt / "dcp").iterdir())  # one shard file per rank (+ metadata)
    with WorkerPool(cfg, tmp_path / "b", roles=("trainer",)) as pool:
        assert pool.call("trainer", "load_checkpoint", str(ckpt)) == 1
        resumed = pool.call("trainer", "train", 1, groups)
        resumed_weights = FSWeightStore(pool.store_root).fetch(2)[1]
    # equal only if the optimizer moments and the schedule came back too
    assert resumed["loss/loss"] == straight["loss/loss"]
    assert resumed["loss/grad_norm"] == straight["loss/grad_norm"]
    assert all(torch.equal(resumed_weights[k], straight_weights[k]) for k in straight_weights)
    # a changed shard file is refused by name
    shard = next(p for p in (ckpt / "dcp").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-8])
    with WorkerPool(cfg, tmp_path / "c", roles=("trainer",)) as pool:
        with pytest.raises(Exception, match=f"shard files missing or changed: \\['{shard.name}'\\]"):
            pool.call("trainer", "load_checkpoint", str(ckpt))
