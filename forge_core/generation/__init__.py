"""Generation: TorchGenerator (in-process sampling); the vLLM adapter is imported lazily where it is used."""

from forge_core.generation.sampling import SamplingParams, filter_logits, sample_next
from forge_core.generation.torch_generator import TorchGenerator

__all__ = ["SamplingParams", "TorchGenerator", "filter_logits", "sample_next"]
