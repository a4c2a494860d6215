"""GRPO train-step cost on CPU: the plain LM head (full [B, T, V] logits kept for the backward) vs the fused chunked
head, and padded vs packed rows (`trainer.pack`), on a Llama-sized vocabulary and responses of mixed lengths.

Memory is the bytes autograd saves for the backward during one micro-batch's forward (unique storages): what the
activations cost, whatever the allocator does. Every variant is measured in this run (best of `--repeats`); the
last line is `RESULT speedup=… saved_ratio=… plain_s=… fused_s=… packed_s=…` (speedup: plain / fused+packed step
time; saved_ratio: plain / fused saved bytes).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from forge_core.losses import get_loss  # noqa: E402
from forge_core.models.tokenizer import build_char_tokenizer  # noqa: E402
from forge_core.training import Trainer, TrainerConfig, episodes_to_train_inputs  # noqa: E402
from forge_core.types import Completion, Episode  # noqa: E402


def build(vocab: int, hidden: int, layers: int, tok):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                         tie_word_embeddings=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return Qwen3ForCausalLM(config)


def episodes(vocab: int, batch: int, prompt: int, response: int) -> list[Episode]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(batch):
        n = response // 8 + (7 * response // 8) * i // max(1, batch - 1)
        comp = Completion("", torch.randint(10, vocab, (n,), generator=g).tolist(), [-3.0] * n)
        out.append(Episode("", "", torch.randint(10, vocab, (prompt,), generator=g).tolist(), comp,
                           advantage=1.0 if i % 2 else -1.0))
    return out


def saved_bytes(trainer: Trainer, inputs, mask) -> int:
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainer.logprobs(inputs, mask, with_entropy=True)
    return sum(storages.values())


def best_step_seconds(trainer: Trainer, inputs, targets, repeats: int) -> float:
    """The fastest of `repeats` optimizer steps on (inputs, targets), after one warm-up step."""
    trainer.train_step(inputs, targets)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        trainer.train_step(inputs, targets)
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(model, tok, eps, plain: bool, pack: bool, repeats: int) -> tuple[float, int]:
    # a hooked LM head runs as a module: the plain path (how forgeflow treats heads it cannot fuse)
    handle = model.lm_head.register_forward_hook(lambda *_: None) if plain else None
    try:
        # every row has its own prompt here: bench/shared_prompts.py measures GRPO groups that share theirs
        config = TrainerConfig(lr=1e-7, micro_batch_size=len(eps), pack=pack, share_prompts=False)
        trainer = Trainer(model, get_loss("grpo"), config, tok.pad_token_id)
        inputs, targets = episodes_to_train_inputs(eps, tok.pad_token_id)
        return best_step_seconds(trainer, inputs, targets, repeats), saved_bytes(trainer, inputs,
                                                                                targets["padding_mask"].bool())
    finally:
        if handle is not None:
            handle.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = build_char_tokenizer()
    model = build(args.vocab, args.hidden, args.layers, tok)
    eps = episodes(args.vocab, args.batch, args.prompt, args.response)
    real = sum(len(e.prompt_ids) + len(e.completion.token_ids) for e in eps)
    variants = {"plain head, padded": (True, False), "fused head, padded": (False, False),
                "fused head, packed": (False, True)}
    results = {name: measure(model, tok, eps, *flags, args.repeats) for name, flags in variants.items()}
    print(f"vocab {args.vocab}, hidden {args.hidden}, {args.layers} layers; batch {args.batch} x (prompt {args.prompt} "
          f"+ response {args.response // 8}..{args.response}) = {real} real tokens; {args.threads} threads")
    print(f"{'variant':<20} {'step s':>8} {'tokens/s':>10} {'saved MB':>10}")
    for name, (seconds, saved) in results.items():
        print(f"{name:<20} {seconds:>8.3f} {real / seconds:>10.0f} {saved / 1e6:>10.1f}")
    plain_s, plain_saved = results["plain head, padded"]
    fused_s, fused_saved = results["fused head, padded"]
    packed_s, _ = results["fused head, packed"]
    print(f"RESULT speedup={plain_s / packed_s:.2f} saved_ratio={plain_saved / fused_saved:.2f} plain_s={plain_s:.3f} "
          f"fused_s={fused_s:.3f} packed_s={packed_s:.3f}")


if __name__ == "__main__":
    main()
