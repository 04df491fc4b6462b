"""The safe expression evaluator: the allow-list, exact arithmetic, and errors naming record and expression."""
import builtins
import math

import pytest
from hypothesis import given, strategies as st

from ndcost.errors import InvalidValue
from ndcost.plugins.expressions import Expression, ExpressionError, divide, evaluate, parse


VALUES = {"s": 4096, "b": 2, "h": 1024, "a": 16, "t": 4, "flag": 1, "off": 0, "half": 0.5}


@pytest.mark.parametrize("text, expected", [
    ("34 * s * b * h", 34 * 4096 * 2 * 1024),
    ("s * b * h * (10 + 24 / t)", 4096 * 2 * 1024 * 16),
    ("5 * a * s * s * b / t", 5 * 16 * 4096 * 4096 * 2 // 4),
    ("s // 3", 4096 // 3),
    ("s % 3", 4096 % 3),
    ("2 ** 10", 1024),
    ("-h + +h", 0),
    ("(s + b) * 2", (4096 + 2) * 2),
    ("1 if flag else 2", 1),
    ("1 if off else 2", 2),
    ("flag and 7", 7),
    ("off or 9", 9),
    ("not off", 1),
    ("not flag", 0),
    ("h > a", 1),
    ("1 < t <= 4", 1),
    ("1 < t < 4", 0),
    ("t == 4 and s != 1", 1),
    ("min(s, h, 3)", 3),
    ("max(s, h)", 4096),
    ("ceil(s / 3)", math.ceil(4096 / 3)),
    ("floor(s / 3)", 4096 // 3),
    ("ceil(half)", 1),
    ("True + 1", 2),
    ("1.5 * 2", 3.0),
    ("7", 7),
])
def test_allowed_forms(text, expected):
    assert evaluate(text, VALUES) == expected


def test_numbers_are_expressions_too():
    assert Expression(3).evaluate({}) == 3
    assert Expression(0.25).evaluate({}) == 0.25


def test_division_stays_exact_where_it_divides():
    value = evaluate("s * b * h * 24 / t", VALUES)
    assert isinstance(value, int) and value == 4096 * 2 * 1024 * 6
    assert evaluate("7 / 2", {}) == 3.5
    assert divide(10, 5) == 2 and isinstance(divide(10, 5), int)
    assert divide(True, 1) == 1


def test_names_are_collected():
    assert Expression("a * s_kv if scores else min(h, dk)").names == {"a", "s_kv", "scores", "h", "dk"}


def test_lookup_may_be_a_function():
    assert Expression("x * 2").evaluate(lambda name: {"x": 21}[name]) == 42


@pytest.mark.parametrize("text, words", [
    ("__import__('os').system('true')", "not allowed"),
    ("().__class__", "not allowed"),
    ("h.real", "Attribute"),
    ("VALUES['h']", "Subscript"),
    ("'text'", "not a number"),
    ("lambda: 1", "Lambda"),
    ("[1, 2]", "List"),
    ("open('x')", "'open' is not allowed"),
    ("eval('1')", "'eval' is not allowed"),
    ("min(a=1)", "keyword"),
    ("max(*h)", "*arguments"),
    ("h @ a", "MatMult"),
    ("h << 2", "LShift"),
    ("~h", "Invert"),
    ("h in a", "In"),
    ("h is a", "Is"),
    ("min", "call it"),
    ("(x := 3)", "NamedExpr"),
    ("f'{h}'", "JoinedStr"),
])
def test_refused_nodes_name_the_record(text, words):
    with pytest.raises(ExpressionError) as info:
        Expression(text, record="slot 'qkv' term 'input'")
    message = str(info.value)
    assert "slot 'qkv' term 'input'" in message
    assert repr(text) in message
    assert words in message


def test_never_calls_eval_or_exec(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("eval/exec must not be called")
    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    assert evaluate("h * 2 if flag else 0", VALUES) == 2048


@pytest.mark.parametrize("text", ["s *", "(s", "s s", "1 +* 2", "", "if"])
def test_syntax_errors_name_record_and_expression(text):
    with pytest.raises(ExpressionError) as info:
        Expression(text, record="value 'tokens'")
    assert "value 'tokens'" in str(info.value)
    assert "does not parse" in str(info.value)
    assert repr(text) in str(info.value)


def test_unknown_name_at_parse_names_record_expression_and_closest():
    with pytest.raises(ExpressionError) as info:
        parse("tokenz * h", record="slot 'ffn' term 'input'", known={"tokens", "h"})
    message = str(info.value)
    assert "slot 'ffn' term 'input'" in message and "'tokenz * h'" in message
    assert "'tokenz'" in message and "tokens" in message


def test_unknown_name_at_evaluation_names_record_and_expression():
    with pytest.raises(ExpressionError) as info:
        Expression("h * nope", record="slot 'x'").evaluate({"h": 1})
    assert "slot 'x'" in str(info.value) and "'h * nope'" in str(info.value) and "nope" in str(info.value)


def test_failures_at_evaluation_are_expression_errors():
    with pytest.raises(ExpressionError, match="division by zero"):
        evaluate("h / off", VALUES, record="r")
    with pytest.raises(ExpressionError, match="exponent"):
        evaluate("2 ** 100000", VALUES)
    with pytest.raises(ExpressionError, match="expected a number"):
        evaluate("h * x", {"h": 1, "x": "two"})
    assert issubclass(ExpressionError, InvalidValue) and issubclass(ExpressionError, ValueError)


def test_bad_expression_type():
    with pytest.raises(ExpressionError, match="string or a number"):
        Expression(["h"], record="r")
    with pytest.raises(ExpressionError, match="string or a number"):
        Expression(True, record="r")


def test_conditionals_and_boolean_operators_short_circuit():
    # the branch not taken, and the operand not needed, are never read
    assert evaluate("h if flag else missing", VALUES) == 1024
    assert evaluate("off and missing", VALUES) == 0
    assert evaluate("flag or missing", VALUES) == 1


@given(x=st.integers(-10**6, 10**6), y=st.integers(-10**6, 10**6).filter(lambda v: v != 0),
       z=st.integers(0, 5))
def test_arithmetic_matches_python(x, y, z):
    values = {"x": x, "y": y, "z": z}
    assert evaluate("x + y * 3 - x // y", values) == x + y * 3 - x // y
    assert evaluate("x ** z", values) == x ** z
    assert evaluate("x / y", values) == (x // y if x % y == 0 else x / y)
    assert evaluate("max(x, y) if x > y else min(x, y)", values) == (max(x, y) if x > y else min(x, y))
