"""GPU paths (run when CUDA is present; `make test` on a CPU machine skips them): generation and training on the
device agree with CPU, multi-version weight loads, and the vLLM adapter against a real engine when vllm is installed."""

import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer, save_model_and_tokenizer
from forge_core.training import Trainer, TrainerConfig, sequence_logprobs
from forge_core.training.batching import collate

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
PROMPTS = ["12+30=", "7-5=", "40+41="]


def test_greedy_generation_on_cuda_matches_cpu():
    cpu, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    gpu, _ = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    want = TorchGenerator(cpu, tok, GREEDY).generate(PROMPTS)
    got = TorchGenerator(gpu.cuda(), tok, GREEDY).generate(PROMPTS)
    assert [c[0].token_ids for c in got] == [c[0].token_ids for c in want]


def test_seeded_sampling_on_cuda_is_reproducible_and_logprobs_match_the_trainer():
    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    model = model.cuda()
    params = SamplingParams(temperature=0.8, max_new_tokens=8)
    gen = TorchGenerator(model, tok, params)
    a, b = gen.generate(PROMPTS, n=4, seed=5), gen.generate(PROMPTS, n=4, seed=5)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    comp = a[0][0]
    prompt_ids = tok(PROMPTS[0], add_special_tokens=False)["input_ids"]
    inputs = [{"tokens": torch.tensor(prompt_ids + comp.token_ids)}]
    mask = torch.ones(1, len(comp.token_ids), dtype=torch.bool)
    batch = collate(inputs, mask, tok.pad_token_id)
    lp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, batch.positions, temperature=0.8)
    assert torch.allclose(lp[0].cpu(), torch.tensor(comp.logprobs), atol=1e-4)


def test_trainer_step_on_cuda_matches_cpu():
    results = []
    for device in ("cpu", "cuda"):
        model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
        trainer = Trainer(model.to(device), get_loss("grpo"), TrainerConfig(lr=1e-3), tok.pad_token_id)
        ids = tok("3+4=7", add_special_tokens=False)["input_ids"]
        inputs = [{"tokens": torch.tensor(ids)}, {"tokens": torch.tensor(ids[:-1])}]
        mask = torch.tensor([[True, True], [True, False]])
        targets = {"padding_mask": mask, "advantages": torch.tensor([1.0, -1.0]),
                   "old_logprobs": None, "ref_logprobs": None}
        results.append((trainer.train_step(inputs, targets), model.lm_head.weight.detach().cpu()))
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-4)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-4)


def test_bf16_compute_with_fp32_masters_on_cuda_tracks_fp32():
    """model.dtype bfloat16 on a GPU: fp32 masters under bf16 autocast follow an fp32 run (the CPU test's bound)."""
    from tests.mixed_precision_helpers import TRACKS, moved_fraction, relative_gap, train

    fp32 = train(torch.float32, None, device="cuda")
    mixed = train(torch.float32, torch.bfloat16, device="cuda")
    assert moved_fraction(mixed) > 0.5
    assert relative_gap(mixed, fp32) < TRACKS


def test_vllm_adapter_against_a_real_engine(tmp_path):
    pytest.importorskip("vllm")
    from forge_core.generation.vllm_generator import VLLMGenerator
    from infra.weightsync import FSWeightStore

    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    save_model_and_tokenizer(model, tok, tmp_path / "hf")
    gen = VLLMGenerator.from_pretrained(str(tmp_path / "hf"), GREEDY, dtype="float32", gpu_memory_utilization=0.2)
    want = TorchGenerator(model.cuda(), tok, GREEDY).generate(PROMPTS)
    got = gen.generate(PROMPTS)
    assert [c[0].token_ids for c in got] == [c[0].token_ids for c in want]
    other, _ = load_model_and_tokenizer("tiny:qwen3-arith", seed=1)
    store = FSWeightStore(tmp_path / "store")
    store.publish(1, other.state_dict())
    gen.load_weights_file(store.path_for(1), 1)
    want = TorchGenerator(other.cuda(), tok, GREEDY).generate(PROMPTS)
    assert [c[0].token_ids for c in gen.generate(PROMPTS)] == [c[0].token_ids for c in want]


def test_decode_checks_for_finished_rows_every_k_steps_with_the_same_samples_on_cuda():
    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    model = model.cuda()
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    runs = [TorchGenerator(model, tok, params, check_every=k).generate(PROMPTS, n=4, seed=3) for k in (1, 8)]
    assert [[c.token_ids for c in g] for g in runs[0]] == [[c.token_ids for c in g] for g in runs[1]]
    # a prompt samples the same alone as in the batch (seed + its index), as on CPU
    alone = TorchGenerator(model, tok, params).generate(PROMPTS[1:2], n=4, seed=4)
    assert [c.token_ids for c in alone[0]] == [c.token_ids for c in runs[0][1]]


def test_fused_head_packing_and_fused_adamw_on_cuda():
    """bf16 autocast on CUDA: the chunked head and packed rows give the padded plain head's logprobs; AdamW fused."""
    from forge_core.training.logprobs import gather_logprobs

    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    model = model.cuda()
    rows = [tok(text, add_special_tokens=False)["input_ids"] for text in ("12+30=42", "7-5=2", "40+41=81")]
    inputs = [{"tokens": torch.tensor(r)} for r in rows]
    mask = torch.tensor([[True, True, True], [True, False, False], [True, True, False]])
    got = {}
    for pack in (False, True):
        trainer = Trainer(model, get_loss("grpo"), TrainerConfig(pack=pack), tok.pad_token_id,
                          compute_dtype=torch.bfloat16)
        with torch.no_grad():
            got[pack] = trainer.logprobs(inputs, mask)[0].float().cpu()
    assert trainer.optimizer.defaults.get("fused") is True
    batch = collate(inputs, mask, tok.pad_token_id)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        hidden = model.model(input_ids=batch.tokens.cuda(), attention_mask=batch.attention_mask.cuda()).last_hidden_state
        prev = (batch.positions.cuda() - 1).clamp(min=0)
        logits = model.lm_head(hidden.gather(1, prev[..., None].expand(-1, -1, hidden.shape[-1])))
        want = gather_logprobs(logits, batch.tokens.cuda().gather(1, batch.positions.cuda())).cpu()
    assert torch.allclose(got[False][mask], want[mask], atol=2e-2)
    assert torch.allclose(got[True][mask], got[False][mask], atol=2e-2)


def test_cuda_graph_decode_samples_what_eager_decode_does(monkeypatch):
    from forge_core.generation import decoder

    captures = []
    capture = decoder.DecodeGraphs.capture
    monkeypatch.setattr(decoder.DecodeGraphs, "capture", lambda self, *a: captures.append(a[1]) or capture(self, *a))
    monkeypatch.setattr(decoder, "LENGTH_BUCKET", 4)
    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    model = model.cuda()
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    eager = TorchGenerator(model, tok, params, cuda_graphs=False).generate(PROMPTS, n=4, seed=2)
    graphed = TorchGenerator(model, tok, params, cuda_graphs=True).generate(PROMPTS, n=4, seed=2)
    assert len(set(captures)) > 1  # several attended lengths, each its own graph
    assert [[c.token_ids for c in g] for g in graphed] == [[c.token_ids for c in g] for g in eager]
    for a, b in zip(graphed, eager):
        for x, y in zip(a, b):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


# ---- the GPU-readiness issue (#28): what CPU tests cannot reach ----

def test_graph_capture_survives_a_receiver_thread_allocating_on_the_device():
    """The decoder captures its CUDA graphs (thread_local, GRAPH_CAPTURE held) while another thread allocates and
    copies on the GPU, as the weight-broadcast receiver does: no capture error, the same samples as eager decode."""
    import threading

    from forge_core.generation.decoder import GRAPH_CAPTURE

    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    model = model.cuda()
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    stop = threading.Event()

    def receiver():
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not stop.is_set():
                with GRAPH_CAPTURE:
                    buffer = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
                buffer.fill_(1)
                stream.synchronize()

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    try:
        graphs = TorchGenerator(model, tok, params, cuda_graphs=True).generate(PROMPTS, n=4, seed=3)
    finally:
        stop.set()
        thread.join(10)
    eager = TorchGenerator(model, tok, params, cuda_graphs=False).generate(PROMPTS, n=4, seed=3)
    assert [[c.token_ids for c in g] for g in graphs] == [[c.token_ids for c in g] for g in eager]


def test_grouped_decode_attention_runs_a_fused_kernel_on_cuda():
    """Without enable_gqa the decode step's attention is accepted by the memory-efficient kernel (math excluded)
    and equals repeated heads."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from forge_core.generation.decoder import attend

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(4, 16, 1, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    keys, values = (torch.randn(4, 4, 300, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    mask = torch.ones(4, 1, 1, 300, dtype=torch.bool, device="cuda")
    mask[:, :, :, :17] = False  # left padding
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        got = attend(q, keys, values, mask, 0.125)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), keys.float().repeat_interleave(4, 1),
                                                            values.float().repeat_interleave(4, 1), attn_mask=mask,
                                                            scale=0.125)
    assert torch.allclose(got.float(), want, atol=2e-2)


def test_kv_budget_chunks_generation_on_cuda_with_the_same_samples():
    from forge_core.generation.kv_budget import kv_budget_bytes, kv_bytes_per_token

    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    model = model.cuda()
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    assert kv_budget_bytes(0.0, torch.device("cuda")) > 0  # a share of the free memory by default
    whole = TorchGenerator(model, tok, params).generate(PROMPTS, n=4, seed=3)
    small = TorchGenerator(model, tok, params, kv_cache_gb=4 * 20 * kv_bytes_per_token(model) / 2**30)
    chunked = small.generate(PROMPTS, n=4, seed=3)
    assert [[c.token_ids for c in g] for g in chunked] == [[c.token_ids for c in g] for g in whole]


def bf16_rollouts(model, tok) -> tuple[list[dict], torch.Tensor, torch.Tensor]:
    """(inputs, response mask [B, T], behaviour logprobs [B, T]) of PROMPTS × 2 samples by a bf16 copy of `model`."""
    import copy

    generator = copy.deepcopy(model).to(torch.bfloat16)
    comps = TorchGenerator(generator, tok, SamplingParams(temperature=1.0, max_new_tokens=8)).generate(
        PROMPTS, n=2, seed=1)
    rows = [(tok(p, add_special_tokens=False)["input_ids"], c) for p, g in zip(PROMPTS, comps) for c in g]
    t = max(len(c.token_ids) for _, c in rows)
    mask = torch.zeros(len(rows), t, dtype=torch.bool)
    behaviour = torch.zeros(len(rows), t)
    for i, (_, c) in enumerate(rows):
        mask[i, :len(c.token_ids)] = True
        behaviour[i, :len(c.token_ids)] = torch.tensor(c.logprobs)
    return [{"tokens": torch.tensor(ids + c.token_ids)} for ids, c in rows], mask, behaviour


def dapo_gradient(model, inputs, mask, advantages, pad_id, old=None) -> torch.Tensor:
    """All parameters' gradient [P], flattened, of DAPO's loss written out here: token mean over the batch of
    max(-A·r, -A·clip(r, 0.8, 1.28)), r = π/π_old; old None: π_old = sg(π) (r = 1, the on-policy gradient -A∇log π)."""
    batch = collate(inputs, mask, pad_id)
    lp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, batch.positions)
    m, adv = mask.to(lp.device), advantages.to(lp.device)[:, None]
    ratio = torch.exp(lp - (lp.detach() if old is None else old.to(lp.device)))
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    model.zero_grad(set_to_none=True)
    (torch.where(m, per_token, 0.0).sum() / m.sum()).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def gradient_of(trainer, step) -> torch.Tensor:
    """The gradient [P] (flattened, before clipping) that `step()` accumulates in trainer.model's parameters."""
    grads = {}
    params = list(trainer.model.parameters())
    hooks = [p.register_post_accumulate_grad_hook(lambda p, i=i: grads.__setitem__(i, p.grad.detach().clone()))
             for i, p in enumerate(params)]
    try:
        step()
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([grads[i].reshape(-1) for i in range(len(params))])


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_a_bf16_generator_beside_fp32_masters_on_cuda_trains_on_policy():
    """trainer.recompute_proximal auto on CUDA, one mini-batch and epoch: the step's gradient is the on-policy one
    (-A·∇log π, token mean), written out here from the start weights, not the clipped ratio against the bf16
    generator's logprobs, which differ from the trainer's (the mismatch metrics see it) and give another gradient."""
    import copy

    from forge_core.training.update import update_policy

    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    model = model.cuda()
    inputs, mask, behaviour = bf16_rollouts(model, tok)
    advantages = torch.tensor([1.0, -1.0] * 3)
    on_policy = dapo_gradient(copy.deepcopy(model), inputs, mask, advantages, tok.pad_token_id)
    against_generator = dapo_gradient(copy.deepcopy(model), inputs, mask, advantages, tok.pad_token_id, behaviour)
    trainer = Trainer(model, get_loss("dapo"), TrainerConfig(lr=1e-4), tok.pad_token_id)
    targets = {"padding_mask": mask, "advantages": advantages, "old_logprobs": behaviour, "ref_logprobs": None}
    metrics = {}
    got = gradient_of(trainer, lambda: metrics.update(update_policy(trainer, inputs, targets, seed=0)))
    assert metrics["rollout/behaviour_kl_k3"] > 0.0
    # the bf16 rounding moves the gradient by ~4e-3 (on CPU): ten times the tolerance or more tells the two apart
    assert gap(against_generator, on_policy) > 1e-3
    assert gap(got, on_policy) < 1e-4  # fp32 on both sides (4e-7 on CPU); the shared-prompt forward is the trainer's


def test_decode_graphs_are_captured_once_per_generator_on_cuda():
    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    gen = TorchGenerator(model.cuda(), tok, SamplingParams(temperature=1.0, max_new_tokens=12), max_batch=8)
    first = gen.generate(PROMPTS, n=4, seed=3)
    captured = dict(gen._decoder.graphs.entries)
    second = gen.generate(PROMPTS, n=4, seed=3)
    assert captured and gen._decoder.graphs.entries.keys() == captured.keys()
    assert all(gen._decoder.graphs.entries[k][0] is captured[k][0] for k in captured)  # the same graphs replayed
    assert [[c.token_ids for c in g] for g in first] == [[c.token_ids for c in g] for g in second]


class DeviceReads(TorchDispatchMode):
    """Logs each aten op that makes the host wait for a value on the GPU: a device-to-host copy, a scalar read
    (.item(), bool()), an op whose output size depends on the data (nonzero, boolean indexing…), with the first
    Python frame outside torch that issued it, as (file, function). Host-to-device copies are not reads."""

    SIZED_BY_DATA = ("nonzero", "masked_select", "equal", "_unique2", "unique_dim", "unique_consecutive",
                     "repeat_interleave")

    def __init__(self):
        super().__init__()
        self.reads: list[tuple[str, str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if reads_the_device(func.overloadpacket.__name__, args, kwargs):
            self.reads.append((func.overloadpacket.__name__, *issuer(sys._getframe(1))))
        return func(*args, **kwargs)


def reads_the_device(name: str, args, kwargs) -> bool:
    from torch.utils._pytree import tree_leaves

    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if not any(t.is_cuda for t in tensors):
        return False
    if name == "_to_copy":
        return args[0].is_cuda and torch.device(kwargs.get("device") or args[0].device).type == "cpu"
    if name == "copy_":
        return args[0].device.type == "cpu" and args[1].is_cuda
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        return any(t is not None and t.dtype == torch.bool for t in args[1])
    return name == "_local_scalar_dense" or name in DeviceReads.SIZED_BY_DATA


def issuer(frame) -> tuple[str, str]:
    """(file, qualified function) of the first frame from `frame` outwards that is not torch's own code; during a
    backward, ("<backward>", the autograd node): the frames are then the caller of backward's, or none (CUDA runs
    the backward in a thread of its own)."""
    if torch._C._current_graph_task_id() != -1:
        node = torch._C._current_autograd_node()
        return "<backward>", node.name() if node is not None else ""
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    while frame is not None and frame.f_code.co_filename.startswith(torch_dir):
        frame = frame.f_back
    return ("", "") if frame is None else (frame.f_code.co_filename, frame.f_code.co_qualname)


def test_a_train_step_reads_its_normalisers_and_its_metrics_from_the_device_once_each_on_cuda():
    """However many micro-batches, the step's own bookkeeping (forge_core/training/trainer.py) and its loss read the
    device exactly twice: the normalisers once (Trainer.train_step), every metric once (StepTotals.read). Counted
    per aten op that waits for a GPU value (DeviceReads), by the code that issued it; the forward's reads (Hugging
    Face's mask checks, the fused head's boolean indexing) and host-to-device copies are outside this claim and are
    printed, not asserted."""
    from tests.unit.test_trainer import make_batch

    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    trainer = Trainer(model.cuda(), get_loss("grpo", beta=0.04), TrainerConfig(lr=1e-3, micro_batch_size=1,
                                                                              share_prompts=False), tok.pad_token_id)
    inputs, targets = make_batch(tok)
    behaviour = targets["old_logprobs"]
    # every metric a step sums: the loss's, the entropy, the KL, the behaviour mismatch (add_mismatch)
    targets = {**targets, "ref_logprobs": behaviour - 0.1, "old_logprobs": None, "behaviour_logprobs": behaviour}
    trainer.train_step(inputs, targets)  # warm-up (allocator, kernels, optimizer state)
    with DeviceReads() as log:
        trainer.train_step(inputs, targets)
    print(f"device reads in one train step of {len(inputs)} micro-batches:", *log.reads, sep="\n  ")
    bookkeeping = [(op, function) for op, file, function in log.reads
                   if file.endswith(os.path.join("forge_core", "training", "trainer.py"))
                   or os.path.join("forge_core", "losses", "") in file]
    assert len(inputs) == 6 and sorted(f for _, f in bookkeeping) == ["StepTotals.read", "Trainer.train_step"], \
        bookkeeping


def test_the_nccl_weight_group_is_formed_with_the_configured_timeout():
    """The weight-broadcast group on CUDA (form_weight_group, NCCL) carries weightsync's timeout, which makes a
    stalled generator's publish fail instead of hanging, and broadcasts. One GPU cannot host a second NCCL member to
    stall (tests/unit/test_dist_store.py observes the timeout with gloo), so the group's own options are read back."""
    from datetime import timedelta

    import torch.distributed as dist

    from infra.dist_store import MasterStore
    from infra.weightsync.broadcast import form_weight_group

    master = MasterStore("127.0.0.1", 1, timeout_s=60)
    group = form_weight_group(master.store, 0, 1, timedelta(seconds=42), torch.device("cuda"))
    try:
        assert group.options._timeout == timedelta(seconds=42)
        tensor = torch.arange(4.0, device="cuda")
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        group.broadcast([tensor], opts).wait()
        assert tensor.tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        group.shutdown()
