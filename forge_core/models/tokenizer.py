"""A character-level tokenizer built locally with `tokenizers` (no download), wrapped as a HF fast tokenizer; the
end-of-turn ids of any tokenizer."""

from __future__ import annotations

import string

PAD, EOS, UNK, IM_START, IM_END = "<pad>", "<|endoftext|>", "<unk>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, UNK, IM_START, IM_END]

# Qwen-style chat template: <|im_start|>role\ncontent<|im_end|>\n ... ending with the assistant's turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_char_tokenizer(alphabet: str | None = None):
    """PreTrainedTokenizerFast with one token per character of `alphabet` (default: printable ASCII) + specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = alphabet or (string.printable.replace("\x0b", "").replace("\x0c", "").replace("\r", ""))
    chars = list(dict.fromkeys(alphabet))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # every character is its own pre-token; special tokens are matched before this runs
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
        additional_special_tokens=[IM_START, IM_END], padding_side="left",
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def end_token_ids(tokenizer, configured) -> list[int]:
    """Every id that ends a turn: generation_config's eos (an int or a list), the tokenizer's eos, and the chat
    template's end-of-turn marker when the vocabulary has one."""
    ids: list[int] = []
    for value in (configured if isinstance(configured, list) else [configured]) + [tokenizer.eos_token_id]:
        if value is not None and value not in ids:
            ids.append(int(value))
    template = getattr(tokenizer, "chat_template", None) or ""
    for marker in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"):
        if marker in template:
            token = tokenizer.convert_tokens_to_ids(marker)
            if isinstance(token, int) and token != tokenizer.unk_token_id and token not in ids:
                ids.append(token)
    return ids


def tokenizer_difference(student, teacher) -> str | None:
    """How `teacher`'s tokenizer differs from `student`'s where token-level scoring needs them equal (vocabulary,
    special tokens, chat template), or None when it does not: a teacher scores the student's exact token ids."""
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    if ours != theirs:
        moved = {t for t in ours.keys() & theirs.keys() if ours[t] != theirs[t]}
        differ = sorted(set(ours) ^ set(theirs) | moved)[:3]  # missing from one, or another id
        return (f"vocabulary: {len(theirs)} tokens against the student's {len(ours)}; they disagree on e.g. "
                f"{differ}")
    for name in ("eos_token", "bos_token", "pad_token", "unk_token"):
        if getattr(student, name, None) != getattr(teacher, name, None):
            return f"{name}: {getattr(teacher, name, None)!r} against the student's {getattr(student, name, None)!r}"
    if student.all_special_tokens != teacher.all_special_tokens:
        return f"special tokens: {teacher.all_special_tokens} against the student's {student.all_special_tokens}"
    if (student.chat_template or "") != (teacher.chat_template or ""):
        return "chat template: the two tokenizers render conversations differently (chat_template differs)"
    return None
