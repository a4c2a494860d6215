"""The one GPU report, for a Qwen3-0.6B-shaped model with random weights (no download), every figure measured in
this run:

- generation: TorchGenerator against Hugging Face `generate` with its dynamic and its static (compiled) cache on the
  same model and batch, EOS masked so every row makes the same number of tokens (vLLM too when installed); the
  decode ceiling (weights + KV cache read once per step at the device's bandwidth) for scale;
- training: tokens/s, MFU (6·params·tokens, attention FLOPs not counted) and peak memory of a GRPO step, fp32
  masters under bf16 autocast, responses of mixed lengths; padded and packed (`trainer.pack`), with `--compile`
  per-layer torch.compile, and the titan backend when torchtitan is installed;
- weight sync until the generator's weights are usable: the fs store (publish + fetch + copy into the generator's
  parameters, every byte read) and the colocated copy (trainer parameters straight into the generator's).

    python bench/gpu_check.py                      # CUDA, qwen3-0.6b shape, a few minutes
    python bench/gpu_check.py --device cpu --shape tiny --quick   # smoke run anywhere (seconds)

Prints a table; the last line is `RESULT gen_tok_s=… hf_static_tok_s=… gen_vs_hf=… train_tok_s=… mfu=…
pack_tok_s=… peak_gb=… sync_gb_s=… sync_fs_ms=… sync_colocated_ms=…` (vllm_tok_s when measured).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# bench/generation.py (this script's directory is on sys.path): the HF baselines, measured the same way there
from generation import no_eos, time_hf, time_ours  # noqa: E402

from forge_core.generation import SamplingParams, TorchGenerator  # noqa: E402
from forge_core.losses import get_loss  # noqa: E402
from forge_core.models.tokenizer import build_char_tokenizer  # noqa: E402
from forge_core.training import Trainer, TrainerConfig, episodes_to_train_inputs  # noqa: E402
from forge_core.types import Completion, Episode  # noqa: E402
from infra.weightsync import FSWeightStore, default_store_root  # noqa: E402

SHAPES = {
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096),
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, max_position_embeddings=512),
}
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}  # dense bf16
PEAK_TB_S = {"H200": 4.8, "H100": 3.35, "A100": 2.0, "L40S": 0.86}  # memory bandwidth


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


def reset_peak(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None


def measure_generation(model, tok, prompts, n, new_tokens, repeats: int) -> dict[str, float]:
    """tokens/s of TorchGenerator and of HF generate (dynamic and static cache) on prompts × n rows, EOS masked."""
    rows = [p for p in prompts for _ in range(n)]  # HF gets every row; TorchGenerator prefills once per prompt
    gen = TorchGenerator(model, tok, SamplingParams(temperature=1.0, max_new_tokens=new_tokens))
    handle = no_eos(model, gen.end_ids)
    try:
        time_ours(gen, prompts[:2], 4)  # warm-up
        ours = min(timed_ours(gen, prompts, n, new_tokens) for _ in range(repeats))
        out = {"ours": len(rows) * new_tokens / ours}
        if gen.device.type == "cuda":  # what the CUDA graphs of the decode step are worth
            eager = TorchGenerator(model, tok, gen.params, cuda_graphs=False)
            out["ours_eager"] = len(rows) * new_tokens / min(timed_ours(eager, prompts, n, new_tokens)
                                                             for _ in range(repeats))
        for cache in ("dynamic", "static"):
            time_hf(model, tok, rows, new_tokens, cache)  # warm-up (static: HF compiles on CUDA)
            out[cache] = len(rows) * new_tokens / min(time_hf(model, tok, rows, new_tokens, cache)
                                                      for _ in range(repeats))
    finally:
        handle.remove()
    return out


def timed_ours(gen: TorchGenerator, prompts, n: int, new_tokens: int) -> float:
    device = gen.device
    sync(device)
    t0 = time.perf_counter()
    out = gen.generate(prompts, n=n, seed=1)
    sync(device)
    assert all(len(c.token_ids) == new_tokens for g in out for c in g)
    return time.perf_counter() - t0


def decode_ceiling(model, rows: int, context: int, device_name: str) -> float | None:
    """tokens/s if each decode step only read the weights and the KV cache once at the device's bandwidth."""
    bandwidth = next((v for k, v in PEAK_TB_S.items() if k in device_name), None)
    if bandwidth is None:
        return None
    cfg = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * rows * context / 2  # mean length
    return rows / ((weights + kv) / (bandwidth * 1e12))


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


def rl_batch(vocab: int, batch: int, prompt_len: int, resp_len: int) -> list[Episode]:
    """GRPO episodes with responses of mixed lengths (resp_len/4 .. resp_len), as rollouts have."""
    g = torch.Generator().manual_seed(0)
    episodes = []
    for i in range(batch):
        n = resp_len // 4 + (3 * resp_len // 4) * i // max(1, batch - 1)
        comp = Completion("", torch.randint(10, vocab, (n,), generator=g).tolist(), [-2.0] * n)
        prompt = torch.randint(10, vocab, (prompt_len,), generator=g).tolist()
        episodes.append(Episode("", "", prompt, comp, advantage=1.0 if i % 2 else -1.0))
    return episodes


def measure_training(model, tok, episodes, steps: int, device, pack: bool = False, compile_layers: bool = False,
                     titan: bool = False) -> tuple[float, float | None]:
    """(real tokens/s, peak GB) of GRPO train steps as forgeflow trains: fp32 master weights and AdamW state,
    compute in the model's (generation) dtype; `titan`: torchtitan's definition of the same weights."""
    from forge_core.training.speed import prepare_for_training

    compute = None if model.dtype == torch.float32 else model.dtype
    master = prepare_for_training(copy.deepcopy(model).float(), compile_layers=compile_layers)
    if titan:
        from forge_core.models.titan import titan_from_hf

        master = titan_from_hf(master)
    trainer = Trainer(master, get_loss("grpo"), TrainerConfig(lr=1e-6, micro_batch_size=max(1, len(episodes) // 4),
                                                              pack=pack), tok.pad_token_id, compute_dtype=compute)
    inputs, targets = episodes_to_train_inputs(episodes, tok.pad_token_id)
    trainer.train_step(inputs, targets)  # warm-up (optimizer state allocation; compilation)
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(inputs, targets)
    sync(device)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(e.prompt_ids) + len(e.completion.token_ids) for e in episodes)
    peak = peak_gb(device)
    del trainer, master
    return steps * tokens / elapsed, peak


def measure_sync(model, device, repeats: int = 3) -> dict[str, float]:
    """Seconds until a generator's bf16 weights equal the trainer's fp32 masters: through the fs store (publish,
    fetch, copy into the generator's parameters) and colocated (one device-to-device cast-copy)."""
    masters = copy.deepcopy(model).float()
    receiver = model  # the generator's copy (model dtype)
    state = {k: v.detach() for k, v in masters.state_dict().items()}
    params = dict(receiver.state_dict())
    parent = default_store_root("gpu-check").parent
    parent.mkdir(parents=True, exist_ok=True)

    def load(got):
        for name, t in got.items():
            params[name].copy_(t)
        sync(device)

    best = {"fs": float("inf"), "colocated": float("inf")}
    with tempfile.TemporaryDirectory(dir=parent) as d:
        store = FSWeightStore(d, keep=2)
        for version in range(1, repeats + 1):
            t0 = time.perf_counter()
            store.publish(version, {k: v.to(receiver.dtype) for k, v in state.items()})  # bf16 on the wire
            load(store.fetch(version)[1])
            best["fs"] = min(best["fs"], time.perf_counter() - t0)
            t0 = time.perf_counter()
            load(state)
            best["colocated"] = min(best["colocated"], time.perf_counter() - t0)
    best["bytes"] = sum(p.numel() * p.element_size() for p in params.values())
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    parser.add_argument("--quick", action="store_true", help="tiny workloads (a smoke run)")
    parser.add_argument("--compile", action="store_true", help="also train with trainer.compile (compiles first)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: by name)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tok = build_char_tokenizer()
    model = build_model(args.shape, tok, dtype, device).eval()
    params = sum(p.numel() for p in model.parameters())
    prompts = [f"Q: {i} + {2 * i} = ?" for i in range(4 if args.quick else 64)]
    n, new_tokens, repeats = (2, 8, 1) if args.quick else (8, 128, 2)
    batch, plen, rlen, steps = (4, 16, 16, 2) if args.quick else (32, 256, 768, 4)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    mfu = (lambda tok_s: 6 * params * tok_s / (peak * 1e12)) if peak else (lambda tok_s: None)  # noqa: E731

    gen = measure_generation(model, tok, prompts, n, new_tokens, repeats)
    ceiling = decode_ceiling(model, len(prompts) * n, 16 + new_tokens, name)
    vllm_tok_s = measure_vllm(model, tok, prompts, n, new_tokens) if device.type == "cuda" else None
    episodes = rl_batch(model.config.vocab_size, batch, plen, rlen)
    train = {"padded": measure_training(model, tok, episodes, steps, device),
             "packed": measure_training(model, tok, episodes, steps, device, pack=True)}
    if args.compile:
        train["compiled"] = measure_training(model, tok, episodes, steps, device, compile_layers=True)
    if importlib.util.find_spec("torchtitan") is not None:
        train["titan"] = measure_training(model, tok, episodes, steps, device, titan=True)
    sync_s = measure_sync(model, device)
    gb = sync_s["bytes"] / 1e9

    best_hf = max(gen["dynamic"], gen["static"])
    rows = [("device", name), ("model", f"{args.shape} ({params / 1e6:.0f}M params, {dtype})"),
            ("generation (TorchGenerator)", f"{gen['ours']:,.0f} tokens/s ({len(prompts)} prompts x {n}, "
                                            f"{new_tokens} new, EOS masked)"),
            ("generation (no CUDA graphs)", f"{gen['ours_eager']:,.0f} tokens/s" if "ours_eager" in gen else "n/a"),
            ("generation (HF dynamic cache)", f"{gen['dynamic']:,.0f} tokens/s"),
            ("generation (HF static cache)", f"{gen['static']:,.0f} tokens/s"),
            ("TorchGenerator / best HF", f"{gen['ours'] / best_hf:.2f}x"),
            ("decode ceiling", f"{ceiling:,.0f} tokens/s (bandwidth bound)" if ceiling else "unknown device"),
            ("generation (vLLM)", f"{vllm_tok_s:,.0f} tokens/s" if vllm_tok_s else "not measured (no vllm/CUDA)")]
    for variant, (tok_s, peak_mem) in train.items():
        m = mfu(tok_s)
        rows.append((f"train step ({variant})", f"{tok_s:,.0f} tokens/s, MFU " + (f"{m:.1%}" if m is not None else
                     "n/a") + (f", peak {peak_mem:.1f} GB" if peak_mem else "") + f" (batch {batch}, prompt {plen}, "
                     f"response {rlen // 4}..{rlen})"))
    rows += [("weight sync (fs store)", f"{sync_s['fs'] * 1e3:.1f} ms for {gb:.2f} GB ({gb / sync_s['fs']:.2f} GB/s), "
                                        "until the generator's weights are usable"),
             ("weight sync (colocated copy)", f"{sync_s['colocated'] * 1e3:.1f} ms "
                                              f"({gb / sync_s['colocated']:.2f} GB/s)")]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    tok_s, peak_mem = train["padded"]
    result = (f"RESULT gen_tok_s={gen['ours']:.0f} hf_static_tok_s={gen['static']:.0f} "
              f"gen_vs_hf={gen['ours'] / best_hf:.3f} train_tok_s={tok_s:.0f} mfu={mfu(tok_s) or 0:.4f} "
              f"pack_tok_s={train['packed'][0]:.0f} peak_gb={peak_mem or 0:.2f} sync_gb_s={gb / sync_s['fs']:.2f} "
              f"sync_fs_ms={sync_s['fs'] * 1e3:.1f} sync_colocated_ms={sync_s['colocated'] * 1e3:.1f}")
    print(result + (f" vllm_tok_s={vllm_tok_s:.0f}" if vllm_tok_s else ""))


if __name__ == "__main__":
    main()
