"""torchtitan model definitions (Qwen3, Llama3) behind the HF causal-LM interface the trainer uses.

Weights enter and leave in HF layout (torchtitan's state-dict adapters), so a titan trainer starts from HF
checkpoints and publishes weights any HF-format generator loads. torchtitan is imported lazily: it is the
optional `titan` extra. Attention is SDPA (causal): flex attention has no CPU backward, and the trainer's batches
are right-padded, so causal attention never lets a real token see padding.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch


def _rope_theta(hf_config) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def _sdpa_layers(layers: list) -> list:
    from torchtitan.models.common.attention import ScaledDotProductAttention

    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return layers


def _head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def qwen3_config(hf_config):
    """torchtitan Qwen3Model.Config equal in shape to a HF Qwen3Config (dense models)."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.qwen3 import Qwen3Model, _build_qwen3_layers

    c, head_dim = hf_config, _head_dim(hf_config)
    norm = lambda dim: RMSNorm.Config(normalized_shape=dim, eps=c.rms_norm_eps)  # noqa: E731
    layers = _build_qwen3_layers(
        n_layers=c.num_hidden_layers, dim=c.hidden_size, n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads, head_dim=head_dim, hidden_dim=c.intermediate_size,
        fuse_qkv=False,  # separate wq/wk/wv map one-to-one onto HF's q/k/v_proj
        attn_backend="flex", rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=c.max_position_embeddings,
                                                    theta=_rope_theta(c)))
    for layer in layers:
        layer.attention_norm, layer.ffn_norm = norm(c.hidden_size), norm(c.hidden_size)
        layer.attention.qk_norm = norm(head_dim)
    return Qwen3Model.Config(
        vocab_size=c.vocab_size, dim=c.hidden_size, norm=norm(c.hidden_size),
        enable_weight_tying=bool(c.tie_word_embeddings),
        tok_embeddings=Embedding.Config(num_embeddings=c.vocab_size, embedding_dim=c.hidden_size),
        lm_head=Linear.Config(in_features=c.hidden_size, out_features=c.vocab_size),
        layers=_sdpa_layers(layers))


def llama3_config(hf_config):
    """torchtitan Llama3Model.Config equal in shape to a HF LlamaConfig (llama3 rope scaling or none)."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    c = hf_config
    if c.tie_word_embeddings:
        raise ValueError("trainer.backend titan: tied embeddings are not supported for Llama models; "
                         "use trainer.backend: hf")
    params = dict(getattr(c, "rope_parameters", None) or {})
    kind = params.get("rope_type", "default")
    if kind not in ("default", "llama3"):
        raise ValueError(f"trainer.backend titan: Llama rope_type {kind!r} is not supported (default or llama3); "
                         "use trainer.backend: hf")
    scaling = {}
    if kind == "llama3":
        scaling = dict(scaling="llama", scaling_factor=params["factor"], low_freq_factor=params["low_freq_factor"],
                       high_freq_factor=params["high_freq_factor"],
                       original_max_position_embeddings=params["original_max_position_embeddings"])
    norm = lambda dim: RMSNorm.Config(normalized_shape=dim, eps=c.rms_norm_eps)  # noqa: E731
    layers = _build_llama3_layers(
        n_layers=c.num_hidden_layers, dim=c.hidden_size, n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads, hidden_dim=c.intermediate_size, fuse_qkv=False, attn_backend="flex",
        rope=ComplexRoPE.Config(dim=_head_dim(c), max_seq_len=c.max_position_embeddings, theta=_rope_theta(c),
                                **scaling))
    for layer in layers:
        layer.attention_norm, layer.ffn_norm = norm(c.hidden_size), norm(c.hidden_size)
    return Llama3Model.Config(
        dim=c.hidden_size, vocab_size=c.vocab_size, norm=norm(c.hidden_size),
        tok_embeddings=Embedding.Config(num_embeddings=c.vocab_size, embedding_dim=c.hidden_size),
        lm_head=Linear.Config(in_features=c.hidden_size, out_features=c.vocab_size),
        layers=_sdpa_layers(layers))


@dataclass(frozen=True)
class TitanArchitecture:
    """Where torchtitan keeps one model family: its module, state-dict adapter and parallelize function."""

    build_config: Callable
    module: str
    adapter: str
    parallelize: str

    def load(self, name: str):
        """The named attribute of the torchtitan module (imported on first use: torchtitan is optional)."""
        return getattr(importlib.import_module(self.module), getattr(self, name))


# HF architecture name -> its torchtitan family
ARCHITECTURES = {
    "Qwen3ForCausalLM": TitanArchitecture(qwen3_config, "torchtitan.models.qwen3", "Qwen3StateDictAdapter",
                                          "parallelize_qwen3"),
    "LlamaForCausalLM": TitanArchitecture(llama3_config, "torchtitan.models.llama3", "Llama3StateDictAdapter",
                                          "parallelize_llama"),
}


def architecture_of(hf_config) -> str:
    """The HF architecture name, checked against what the titan backend supports."""
    arch = (getattr(hf_config, "architectures", None) or [type(hf_config).__name__.replace("Config", "ForCausalLM")])[0]
    if arch not in ARCHITECTURES:
        raise ValueError(f"trainer.backend titan supports {sorted(ARCHITECTURES)}; model.path is a {arch} — "
                         "use trainer.backend: hf for it")
    return arch


class TitanCausalLM(torch.nn.Module):
    """A torchtitan decoder with the slice of the HF causal-LM interface the trainer uses, plus HF-layout I/O."""

    def __init__(self, hf_config, parallelism=None):
        super().__init__()
        self.architecture = ARCHITECTURES[architecture_of(hf_config)]
        self.hf_config = hf_config
        self.titan_config = self.architecture.build_config(hf_config)
        if parallelism is not None:  # a torchtitan ParallelismConfig: sets the TP/SP sharding plan of the modules
            self.titan_config.update_from_config(config=SimpleNamespace(parallelism=parallelism))
        self.decoder = self.titan_config.build()
        self.decoder.init_states(buffer_device=torch.device("cpu"))
        # as HF's nn.Embedding(padding_idx=pad_token_id): the pad row gets no gradient through the embedding lookup
        self.decoder.tok_embeddings.padding_idx = getattr(hf_config, "pad_token_id", None)
        self.adapter = self.architecture.load("adapter")(self.titan_config, None)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """SimpleNamespace(logits [B, L, V]) for right-padded input_ids [B, L]."""
        _check_right_padded(attention_mask)
        return SimpleNamespace(logits=_full(self.decoder(input_ids)))

    def response_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                        rows: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] at positions `rows` [B, T] of right-padded input_ids [B, L]: only those go through the LM
        head, whose output dominates a step's memory with a large vocabulary (not under tensor parallelism, where the
        sequence-sharded hidden states go through the vocab-sharded head whole)."""
        _check_right_padded(attention_mask)
        self.decoder._skip_lm_head = True  # the decoder returns the final norm's output
        try:
            hidden = self.decoder(input_ids)
        finally:
            self.decoder._skip_lm_head = False
        if hasattr(hidden, "full_tensor"):  # tensor parallel
            logits = _full(self.decoder.lm_head(hidden))
            return logits.gather(1, rows[..., None].expand(-1, -1, logits.shape[-1]))
        return self.decoder.lm_head(hidden.gather(1, rows[..., None].expand(-1, -1, hidden.shape[-1])))

    def get_output_embeddings(self):
        """None: the LM head runs inside the decoder (see response_logits)."""
        return None

    def load_hf_state_dict(self, hf_state: dict[str, torch.Tensor]) -> None:
        """Load HF-layout weights (e.g. AutoModelForCausalLM.state_dict()) into the decoder."""
        titan_state = self.adapter.from_hf(dict(hf_state))
        result = self.decoder.load_state_dict(titan_state, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(f"HF weights do not fit the titan {architecture_of(self.hf_config)} model: missing "
                             f"{result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}")

    def to_hf_state_dict(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """HF-layout weights from this module's (full, unsharded) state dict `state` (default: its own)."""
        state = self.state_dict() if state is None else state
        prefix = "decoder."
        hf_state = self.adapter.to_hf({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        if self.hf_config.tie_word_embeddings:  # HF state dicts list the tied head too
            hf_state["lm_head.weight"] = hf_state["model.embed_tokens.weight"]
        return hf_state

    def to_hf_model(self, state: dict[str, torch.Tensor] | None = None):
        """A transformers model holding these weights (for save_pretrained)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(self.hf_config)
        model.load_state_dict(self.to_hf_state_dict(state))
        return model


def _check_right_padded(attention_mask: torch.Tensor | None) -> None:
    if attention_mask is not None and bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()):
        # causal SDPA ignores the mask: a pad before a real token would be attended to
        raise ValueError("TitanCausalLM needs right-padded inputs (attention_mask 1…1 0…0 per row)")


def _full(logits: torch.Tensor) -> torch.Tensor:
    """Plain logits; under tensor parallelism the head's output is a vocab-sharded DTensor (loss-parallel layout)."""
    return logits.full_tensor() if hasattr(logits, "full_tensor") else logits


def titan_from_hf(hf_model, parallelism=None) -> TitanCausalLM:
    """A TitanCausalLM with the weights, dtype and device of a transformers causal LM (`parallelism`: a torchtitan
    ParallelismConfig the model will be parallelized with)."""
    param = next(hf_model.parameters())
    model = TitanCausalLM(hf_model.config, parallelism)
    # only real floating tensors: Module.to(dtype) would also cast Llama's complex rope cache to real
    model._apply(lambda t: t.to(device=param.device, dtype=param.dtype) if t.is_floating_point() else t.to(param.device))
    model.load_hf_state_dict(hf_model.state_dict())
    return model

