import json

import pytest

from cli.main import main
from forge_core.data import (
    ArithSpec,
    ChatTemplate,
    PlainTemplate,
    load_problems,
    make_arith_problems,
    write_gsm8k_jsonl,
)
from forge_core.models import build_char_tokenizer
from forge_core.rewards import MathReward


def test_arith_is_deterministic_and_splits_are_disjoint():
    a = make_arith_problems(300, seed=1, split="train", spec=ArithSpec(max_value=99))
    b = make_arith_problems(300, seed=1, split="train", spec=ArithSpec(max_value=99))
    test = make_arith_problems(200, seed=1, split="test", spec=ArithSpec(max_value=99))
    assert a == b
    assert len({p.question for p in a}) == 300
    assert not {p.question for p in a} & {p.question for p in test}
    assert make_arith_problems(5, seed=2) != make_arith_problems(5, seed=1)


def test_arith_answers_are_correct_and_gradeable():
    spec = ArithSpec(max_value=12, num_terms=3, ops=("+", "-", "*"), style="word")
    reward = MathReward()
    for p in make_arith_problems(50, seed=0, spec=spec):
        expr = p.solution.split("=")[0]
        assert str(eval(expr)) == p.target  # test-only check of the generator against Python's arithmetic
        assert reward(p.question, f"<answer>{p.target}</answer>", p.solution) == 1.0


def test_arith_knob_errors():
    with pytest.raises(ValueError, match="ops"):
        make_arith_problems(1, spec=ArithSpec(ops=("/",)))
    with pytest.raises(ValueError, match="distinct train problems"):
        make_arith_problems(1000, spec=ArithSpec(max_value=3))


def test_gsm8k_round_trip_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    problems = make_arith_problems(20, seed=0)
    path = write_gsm8k_jsonl(problems, tmp_path / "a.jsonl")
    loaded = load_problems(path)
    assert loaded.problems == problems and loaded.skipped == []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    assert load_problems(tmp_path / "a.parquet").problems == problems


def test_malformed_rows_raise_with_file_and_line_or_are_skipped(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([
        json.dumps({"question": "1+1=", "answer": "2\n#### 2"}),
        "{not json",
        json.dumps({"question": "2+2="}),
        json.dumps({"question": "3+3=", "answer": "six"}),
        json.dumps({"question": "4+4=", "answer": "#### 8"}),
    ]))
    with pytest.raises(ValueError, match=r"bad.jsonl:2: invalid JSON.*dataset.on_error: skip"):
        load_problems(path)
    result = load_problems(path, on_error="skip")
    assert [p.target for p in result.problems] == ["2", "8"]
    assert len(result.skipped) == 3
    assert "bad.jsonl:3: missing or empty key(s) ['answer']" in result.skipped[1]
    assert "bad.jsonl:4: answer has no '#### <number>'" in result.skipped[2]


def test_math_format(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"problem": "half?", "solution": "It is $\\boxed{\\frac{1}{2}}$."}) + "\n")
    (p,) = load_problems(path, fmt="math").problems
    assert p.target == "\\frac{1}{2}"
    assert MathReward()("q", "<answer>0.5</answer>", p.solution) == 1.0


def test_missing_file_names_the_fix(tmp_path):
    with pytest.raises(ValueError, match="does not exist.*make-arith"):
        load_problems(tmp_path / "nope.jsonl")


def test_templates():
    assert PlainTemplate().render("3+4=") == "Q: 3+4="
    text = ChatTemplate().render("3+4=", build_char_tokenizer())
    assert "<think>" in text and text.endswith("<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_without_a_tokenizer_template_is_refused():
    tok = build_char_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat needs a tokenizer with a chat template.*dataset.template: plain"):
        ChatTemplate().render("3+4=", tok)


def test_cli_make_arith(tmp_path, capsys):
    out = tmp_path / "arith.jsonl"
    assert main(["data", "make-arith", "--out", str(out), "--n", "12", "--split", "test", "--max-value", "50"]) == 0
    assert len(load_problems(out).problems) == 12
    assert "wrote 12 test problems" in capsys.readouterr().out
    assert main(["data", "make-arith", "--out", str(out), "--n", "5", "--ops", "/"]) == 2
