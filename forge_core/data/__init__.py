"""Datasets (GSM8K/MATH formats, synthetic arithmetic) and prompt templates."""

from forge_core.data.arith import ArithSpec, make_arith_problems, write_gsm8k_jsonl
from forge_core.data.problems import Problem, ProblemSet, load_hub_problems, load_problems
from forge_core.data.templates import ChatTemplate, PlainTemplate, build_template

__all__ = [
    "ArithSpec", "ChatTemplate", "PlainTemplate", "Problem", "ProblemSet", "build_template",
    "load_hub_problems", "load_problems", "make_arith_problems", "write_gsm8k_jsonl",
]
