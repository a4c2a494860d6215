"""The `dataset` section, declared and checked here once: where the problems come from, how prompts are rendered,
and (dataset.kind arith) the generated problems' difficulty knobs, which it inherits from ArithSpec."""

from __future__ import annotations

from dataclasses import dataclass

from forge_core.data.arith import ArithSpec

KINDS = ("arith", "gsm8k", "math", "hub")
ON_ERROR = ("raise", "skip")
TEMPLATES = ("plain", "chat")


@dataclass
class DatasetConfig(ArithSpec):
    """Config section `dataset`."""

    kind: str = "arith"  # arith | gsm8k | math | hub
    path: str | None = None  # local JSONL/parquet (gsm8k/math) or hub name (hub)
    eval_path: str | None = None
    split: str = "train"
    eval_split: str = "test"
    seed: int = 0  # data seed (fixed across run seeds so every run is judged on the same held-out set)
    on_error: str = "raise"  # raise | skip malformed rows
    template: str = "plain"  # plain | chat
    prompt_prefix: str = "Q: "  # template plain: the text before each question
    system_prompt: str | None = None  # template chat: the system turn (null: ask for <think>/<answer> tags)
    train_size: int = 20000  # kind arith: how many training problems are generated

    def check(self, where: str = "dataset") -> None:
        """ValueError naming the key and the fix; the arith knobs are checked only when they are used."""
        for key, options in (("kind", KINDS), ("on_error", ON_ERROR), ("template", TEMPLATES)):
            if getattr(self, key) not in options:
                raise ValueError(f"{where}.{key} = {getattr(self, key)!r} is not one of {list(options)}")
        if self.kind == "arith":
            super().check(where)
            if self.train_size < 1:
                raise ValueError(f"{where}.train_size must be >= 1, got {self.train_size}")
        elif not self.path:
            raise ValueError(f"{where}.kind {self.kind!r} needs {where}.path")
