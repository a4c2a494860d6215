"""TorchGenerator ÷ vLLM (its CPU build) tokens/s on SmolLM2-135M-Instruct, the main job's model and prompts, in one
run, each at its best settings on this machine's cores.

Shapes: the main job's rollout (8 prompts × 8 samples = 64 rows, 16 new tokens) and a long one (32 prompts × 8 = 256
rows, 128 new tokens). Every row runs to its length (vLLM: ignore_eos; ours: the end ids masked), so both write
rows × new tokens; the time is the whole `generate` call (prefill, decode, logprobs). vLLM gets what the flow sends
it: one seeded n=1 request per sample (VLLMGenerator), logprobs=0, processed logprobs, prefix caching.

Best settings: vLLM is started once per thread setting (`--vllm-threads`, default: its own `auto` binding, then
unbound with 1 and 2 OpenMP threads: forge_core/generation/vllm_generator.py) and each shape takes its fastest;
TorchGenerator runs with `--threads` and takes the better of fp32 and bf16 weights per shape. Best of `--repeats`.
Ends with `RESULT ratio_main=<ours ÷ vLLM at 64×16> ratio_long=<at 256×128> …`.

    .venv/bin/python bench/vllm_generation.py            # ~10 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # bench.generation's no_eos; configs/ is read relative to the repository

SHAPES = {"main": (8, 8, 16), "long": (32, 8, 128)}  # prompts, samples per prompt, new tokens


def main_job_prompt_ids(count: int) -> list[list[int]]:
    """The first `count` training prompts of configs/grpo_smollm2.yaml as token ids (chat template applied)."""
    from forge_core.models import load_tokenizer
    from infra import components as C
    from infra.config_checks import load_config

    cfg = load_config("configs/grpo_smollm2.yaml")
    tok = load_tokenizer(cfg.model.path)
    prompts = C.build_splits(cfg, tok).train_prompts[:count]
    return [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]


def seconds_vllm(llm, rows: list[list[int]], n: int, new: int, seed: int) -> float:
    """One generate call of n seeded n=1 requests per prompt row, each writing `new` tokens."""
    from vllm import SamplingParams

    from forge_core.generation.sampling import stream_keys

    inputs = [{"prompt_token_ids": r} for r in rows for _ in range(n)]
    requests = [SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=new, logprobs=0, seed=s,
                               ignore_eos=True) for s in stream_keys(seed, range(len(rows)), n)]
    start = time.perf_counter()
    got = llm.generate(inputs, requests, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == new for o in got)
    return elapsed


def time_vllm_shapes(path: str, threads: str, repeats: int) -> dict[str, float]:
    """tokens/s of each shape on one engine started as the flow starts it, with `threads` ('auto': vLLM's own
    binding)."""
    from forge_core.generation import SamplingParams
    from forge_core.generation.vllm_generator import VLLMGenerator

    gen = VLLMGenerator.from_pretrained(path, SamplingParams(), dtype="bfloat16", max_model_len=512,
                                        kv_cache_gb=1.0, threads=None if threads == "auto" else int(threads))
    rows = main_job_prompt_ids(max(p for p, _, _ in SHAPES.values()))
    out = {}
    for name, (prompts, n, new) in SHAPES.items():
        seconds_vllm(gen.llm, rows[:prompts], n, new, 99)  # warm-up
        out[name] = prompts * n * new / min(seconds_vllm(gen.llm, rows[:prompts], n, new, r) for r in range(repeats))
    gen.close()
    return out


def seconds_torch(gen, rows: list[list[int]], n: int, new: int, seed: int) -> float:
    """One TorchGenerator.generate call: n samples per prompt row, each writing `new` tokens (end ids masked)."""
    from forge_core.generation import SamplingParams

    start = time.perf_counter()
    got = gen.generate([""] * len(rows), n=n, seed=seed, params=SamplingParams(temperature=1.0, max_new_tokens=new),
                       prompt_ids=rows)
    elapsed = time.perf_counter() - start
    assert all(len(c.token_ids) == new for g in got for c in g)
    return elapsed


def time_torch_shapes(model_name: str, threads: int, repeats: int) -> dict[str, dict[str, float]]:
    """tokens/s of each shape for TorchGenerator with fp32 and with bf16 weights."""
    import torch

    from bench.generation import no_eos
    from forge_core.generation import TorchGenerator
    from forge_core.models import load_model_and_tokenizer

    torch.set_num_threads(threads)
    rows = main_job_prompt_ids(max(p for p, _, _ in SHAPES.values()))
    found: dict[str, dict[str, float]] = {name: {} for name in SHAPES}
    for dtype in (torch.float32, torch.bfloat16):
        model, tok = load_model_and_tokenizer(model_name, dtype=dtype)
        gen = TorchGenerator(model.eval(), tok)
        handle = no_eos(model, gen.end_ids)
        for name, (prompts, n, new) in SHAPES.items():
            seconds_torch(gen, rows[:prompts], n, new, 99)  # warm-up
            best = min(seconds_torch(gen, rows[:prompts], n, new, r) for r in range(repeats))
            found[name][str(dtype).split(".")[-1]] = prompts * n * new / best
        handle.remove()
    return found


def measure_vllm_in_child(threads: str, repeats: int) -> dict[str, float]:
    """One engine per thread setting, each in a fresh process (vLLM reads its thread settings at start)."""
    out = subprocess.run([sys.executable, __file__, "--child-vllm", threads, "--repeats", str(repeats)],
                         capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("CHILD ")]
    if out.returncode or not lines:
        raise RuntimeError(f"vLLM with threads={threads} failed:\n{out.stderr[-3000:]}")
    return {k: float(v) for k, v in (item.split("=") for item in lines[-1].split()[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2, help="TorchGenerator's threads")
    parser.add_argument("--vllm-threads", default="auto,1,2")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child-vllm", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.chdir(ROOT)
    from forge_core.models.catalog import resolve_model_path

    path = resolve_model_path(args.model)
    if args.child_vllm is not None:
        found = time_vllm_shapes(path, args.child_vllm, args.repeats)
        print("CHILD " + " ".join(f"{k}={v:.2f}" for k, v in found.items()), flush=True)
        return
    ours = time_torch_shapes(args.model, args.threads, args.repeats)
    vllm = {t: measure_vllm_in_child(t, args.repeats) for t in args.vllm_threads.split(",")}
    print(f"{'shape':<22}" + "".join(f"{'vLLM ' + t:>12}" for t in vllm) + f"{'ours fp32':>12}{'ours bf16':>12}"
          f"{'ratio':>8}   (tokens/s, best of {args.repeats}; ours with {args.threads} threads)")
    ratios = {}
    for name, (prompts, n, new) in SHAPES.items():
        best_vllm = max(v[name] for v in vllm.values())
        best_ours = max(ours[name].values())
        ratios[name] = best_ours / best_vllm
        print(f"{f'{name} {prompts * n}x{new}':<22}" + "".join(f"{v[name]:>12.0f}" for v in vllm.values())
              + f"{ours[name]['float32']:>12.0f}{ours[name]['bfloat16']:>12.0f}{ratios[name]:>8.2f}")
    best = {name: max(vllm, key=lambda t: vllm[t][name]) for name in SHAPES}
    print(f"RESULT ratio_main={ratios['main']:.2f} ratio_long={ratios['long']:.2f} "
          f"ours_main_tok_s={max(ours['main'].values()):.0f} vllm_main_tok_s={vllm[best['main']]['main']:.0f} "
          f"ours_long_tok_s={max(ours['long'].values()):.0f} vllm_long_tok_s={vllm[best['long']]['long']:.0f} "
          f"vllm_threads_main={best['main']} vllm_threads_long={best['long']}")


if __name__ == "__main__":
    main()
