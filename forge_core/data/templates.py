"""Prompt templates: plain text and chat (system prompt asking for <think> and <answer> tags)."""

from __future__ import annotations

from dataclasses import dataclass

REASONING_SYSTEM_PROMPT = (
    "You are a helpful assistant. Think step by step inside <think> </think> tags, "
    "then give only the final number inside <answer> </answer> tags."
)


@dataclass(frozen=True)
class PlainTemplate:
    """`prefix + question + suffix`, e.g. 'Q: 3+4=' -> the model continues with the answer."""

    prefix: str = "Q: "
    suffix: str = ""

    def render(self, question: str, tokenizer=None) -> str:
        return f"{self.prefix}{question}{self.suffix}"


@dataclass(frozen=True)
class ChatTemplate:
    """System + user messages rendered by the tokenizer's chat template (generation prompt appended)."""

    system_prompt: str = REASONING_SYSTEM_PROMPT

    def render(self, question: str, tokenizer=None) -> str:
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question}]
        if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
            # markers invented here would be plain text to the model, which was never trained on them
            raise ValueError("dataset.template: chat needs a tokenizer with a chat template, and model.path's has "
                             "none; use dataset.template: plain (with dataset.prompt_prefix) or a chat model")
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


TEMPLATES = {"plain": PlainTemplate, "chat": ChatTemplate}


def build_template(name: str, **kwargs):
    """A prompt template by name ('plain' or 'chat')."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown dataset.template {name!r}; choose one of {sorted(TEMPLATES)}")
    return TEMPLATES[name](**kwargs)
