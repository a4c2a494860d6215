"""One-shot check of a GPU machine: generation tokens/s (TorchGenerator, and vLLM when installed), train-step
throughput and MFU, weight-sync bandwidth, for a Qwen3-0.6B-shaped model with random weights (no download).

    python bench/gpu_check.py                      # CUDA, qwen3-0.6b shape, a few minutes
    python bench/gpu_check.py --device cpu --shape tiny --quick   # smoke run anywhere (seconds)

Prints a table; the last line is `RESULT gen_tok_s=… train_tok_s=… mfu=… sync_gb_s=…` (vllm_tok_s when measured).
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from forge_core.generation import SamplingParams, TorchGenerator  # noqa: E402
from forge_core.losses import get_loss  # noqa: E402
from forge_core.models.tokenizer import build_char_tokenizer  # noqa: E402
from forge_core.training import Trainer, TrainerSettings, episodes_to_train_inputs  # noqa: E402
from forge_core.types import Completion, Episode  # noqa: E402
from infra.weightsync import FSWeightStore, default_store_root  # noqa: E402

SHAPES = {
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096),
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, max_position_embeddings=512),
}
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}  # dense bf16


def build_model(shape: str, tokenizer, dtype, device):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, **SHAPES[shape])
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.to(dtype)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_generation(model, tok, prompts, n, new_tokens, device) -> float:
    gen = TorchGenerator(model, tok, SamplingParams(temperature=1.0, max_new_tokens=new_tokens))
    gen.generate(prompts[:2], n=1, seed=0)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    out = gen.generate(prompts, n=n, seed=1)
    sync(device)
    return sum(len(c.token_ids) for g in out for c in g) / (time.perf_counter() - t0)


def measure_vllm(model, tok, prompts, n, new_tokens) -> float | None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return None
    from forge_core.generation.vllm_generator import VLLMGenerator
    from forge_core.models import save_model_and_tokenizer

    with tempfile.TemporaryDirectory() as d:
        save_model_and_tokenizer(model, tok, d)
        gen = VLLMGenerator.from_pretrained(d, SamplingParams(temperature=1.0, max_new_tokens=new_tokens),
                                            dtype="bfloat16", gpu_memory_utilization=0.4)
        gen.generate(prompts[:2], n=1, seed=0)
        t0 = time.perf_counter()
        out = gen.generate(prompts, n=n, seed=1)
        return sum(len(c.token_ids) for g in out for c in g) / (time.perf_counter() - t0)


def measure_training(model, tok, batch: int, prompt_len: int, resp_len: int, steps: int, device) -> float:
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    episodes = []
    for i in range(batch):
        ids = torch.randint(10, vocab, (resp_len,), generator=g).tolist()
        comp = Completion("", ids, [-2.0] * resp_len)
        prompt = torch.randint(10, vocab, (prompt_len,), generator=g).tolist()
        episodes.append(Episode("", "", prompt, comp, advantage=1.0 if i % 2 else -1.0))
    # as forgeflow trains: fp32 master weights and AdamW state, compute in the model's (generation) dtype
    compute = None if model.dtype == torch.float32 else model.dtype
    master = copy.deepcopy(model).float()
    trainer = Trainer(master, get_loss("grpo"), TrainerSettings(lr=1e-6, micro_batch_size=max(1, batch // 4),
                                                                compute_dtype=compute), tok.pad_token_id)
    inputs, targets = episodes_to_train_inputs(episodes, tok.pad_token_id)
    trainer.train_step(inputs, targets)  # warm-up (optimizer state allocation)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(inputs, targets)
    sync(device)
    return steps * batch * (prompt_len + resp_len) / (time.perf_counter() - t0)


def measure_sync(model, repeats: int = 3) -> float:
    state = {k: v.detach() for k, v in model.state_dict().items()}
    size = sum(v.numel() * v.element_size() for v in state.values())
    parent = default_store_root("gpu-check").parent
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent) as d:
        store = FSWeightStore(d, keep=2)
        best = float("inf")
        for version in range(1, repeats + 1):
            t0 = time.perf_counter()
            store.publish(version, state)
            store.fetch(version)
            best = min(best, time.perf_counter() - t0)
    return size / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    parser.add_argument("--quick", action="store_true", help="tiny workloads (a smoke run)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: by name)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tok = build_char_tokenizer()
    model = build_model(args.shape, tok, dtype, device)
    params = sum(p.numel() for p in model.parameters())
    prompts = [f"Q: {i} + {2 * i} = ?" for i in range(4 if args.quick else 64)]
    n, new_tokens = (2, 8) if args.quick else (8, 128)
    batch, plen, rlen, steps = (4, 16, 16, 2) if args.quick else (32, 256, 768, 5)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)

    gen_tok_s = measure_generation(model, tok, prompts, n, new_tokens, device)
    vllm_tok_s = measure_vllm(model, tok, prompts, n, new_tokens) if device.type == "cuda" else None
    train_tok_s = measure_training(model, tok, batch, plen, rlen, steps, device)
    mfu = 6 * params * train_tok_s / (peak * 1e12) if peak else None
    sync_gb_s = measure_sync(model)

    rows = [("device", name), ("model", f"{args.shape} ({params / 1e6:.0f}M params, {dtype})"),
            ("generation (TorchGenerator)", f"{gen_tok_s:,.0f} tokens/s ({len(prompts)} prompts x {n}, "
                                            f"{new_tokens} new)"),
            ("generation (vLLM)", f"{vllm_tok_s:,.0f} tokens/s" if vllm_tok_s else "not measured (no vllm/CUDA)"),
            ("train step", f"{train_tok_s:,.0f} tokens/s (batch {batch} x {plen + rlen})"),
            ("MFU", f"{mfu:.1%} of {peak:.0f} TFLOPS" if mfu is not None else "unknown peak (--peak-tflops)"),
            ("weight sync (publish+fetch)", f"{sync_gb_s:.2f} GB/s")]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    result = f"RESULT gen_tok_s={gen_tok_s:.0f} train_tok_s={train_tok_s:.0f} mfu={mfu or 0:.4f} sync_gb_s={sync_gb_s:.2f}"
    print(result + (f" vllm_tok_s={vllm_tok_s:.0f}" if vllm_tok_s else ""))


if __name__ == "__main__":
    main()
