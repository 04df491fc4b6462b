"""A small safe evaluator for the byte expressions of the op records.

Op records are data (YAML shipped by ndcost or by a third party), so their
expressions must never reach ``eval`` or ``exec``. An expression is parsed
with :mod:`ast` and only an allow-list of nodes is accepted: numbers, names,
``+ - * / // % **``, unary ``-``/``+``, parentheses, comparisons,
``and``/``or``/``not``, conditional expressions (``x if c else y``) and calls
of ``min``, ``max``, ``ceil`` and ``floor``. Anything else (attributes,
subscripts, strings, lambdas, other calls) is refused when the expression is
parsed, naming the record and the expression.

Arithmetic keeps integers exact: ``/`` of two integers that divide evenly is
an integer, a float only where the division makes it one. Booleans (from a
comparison, ``not`` or a value) count as 1 and 0.
"""
from __future__ import annotations

import ast
import difflib
import math
import operator
from typing import Any, Callable, FrozenSet, Iterable, Mapping, Optional, Union

from ndcost.errors import InvalidValue

Number = Union[int, float]
Lookup = Union[Mapping[str, Any], Callable[[str], Any]]

# The largest exponent ``**`` accepts: byte expressions square a sequence at most,
# and a huge power would stall the process on an integer of millions of digits.
MAX_EXPONENT = 64


class ExpressionError(InvalidValue):
    """An expression that does not parse, reads an unknown name, or fails to evaluate; names record and text."""


def _number(value: Any) -> Number:
    """*value* as an int or float; a bool counts as 1 or 0."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    raise TypeError(f"expected a number, got {value!r}")


def divide(x: Number, y: Number) -> Number:
    """``x / y``, an int where both are ints and *y* divides *x*, else a float."""
    x, y = _number(x), _number(y)
    if isinstance(x, int) and isinstance(y, int):
        if y == 0:
            raise ZeroDivisionError("division by zero")
        if x % y == 0:
            return x // y
    return x / y


def _power(x: Number, y: Number) -> Number:
    x, y = _number(x), _number(y)
    if abs(y) > MAX_EXPONENT:
        raise ValueError(f"exponent {y} is larger than {MAX_EXPONENT}")
    return x ** y


def _ceil(x: Number) -> int:
    return math.ceil(_number(x))


def _floor(x: Number) -> int:
    return math.floor(_number(x))


def _min(*args: Number) -> Number:
    if not args:
        raise TypeError("min() needs at least one argument")
    return min(_number(a) for a in args)


def _max(*args: Number) -> Number:
    if not args:
        raise TypeError("max() needs at least one argument")
    return max(_number(a) for a in args)


FUNCTIONS = {"min": _min, "max": _max, "ceil": _ceil, "floor": _floor}

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: divide,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**"}

Compiled = Callable[[Callable[[str], Any]], Any]


class _Refused(Exception):
    """A node outside the allow-list (turned into an ExpressionError naming the record)."""


def _compile(node: ast.AST, names: set) -> Compiled:
    """A closure evaluating *node* with a name lookup; refuses any node outside the allow-list."""
    if isinstance(node, ast.Expression):
        return _compile(node.body, names)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float)):
            raise _Refused(f"the constant {node.value!r} is not a number")
        return lambda lookup, value=value: value
    if isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            raise _Refused(f"{node.id!r} is a function; call it, as {node.id}(...)")
        name = node.id
        names.add(name)
        return lambda lookup, name=name: _number(lookup(name))
    if isinstance(node, ast.BinOp):
        op = _BINARY.get(type(node.op))
        if op is None:
            raise _Refused(f"the operator {type(node.op).__name__} is not allowed "
                           f"(allowed: {' '.join(_SYMBOL.values())})")
        left, right = _compile(node.left, names), _compile(node.right, names)
        return lambda lookup: op(left(lookup), right(lookup))
    if isinstance(node, ast.UnaryOp):
        operand = _compile(node.operand, names)
        if isinstance(node.op, ast.USub):
            return lambda lookup: -operand(lookup)
        if isinstance(node.op, ast.UAdd):
            return operand
        if isinstance(node.op, ast.Not):
            return lambda lookup: int(not operand(lookup))
        raise _Refused(f"the unary operator {type(node.op).__name__} is not allowed")
    if isinstance(node, ast.Compare):
        ops = []
        for op in node.ops:
            fn = _COMPARE.get(type(op))
            if fn is None:
                raise _Refused(f"the comparison {type(op).__name__} is not allowed (allowed: == != < <= > >=)")
            ops.append(fn)
        operands = [_compile(node.left, names)] + [_compile(c, names) for c in node.comparators]

        def compare(lookup, ops=tuple(ops), operands=tuple(operands)):
            left = operands[0](lookup)
            for fn, right_fn in zip(ops, operands[1:]):
                right = right_fn(lookup)
                if not fn(left, right):
                    return 0
                left = right
            return 1
        return compare
    if isinstance(node, ast.BoolOp):
        parts = tuple(_compile(v, names) for v in node.values)
        if isinstance(node.op, ast.And):
            def all_of(lookup):
                value = 1
                for part in parts:
                    value = part(lookup)
                    if not value:
                        return value
                return value
            return all_of

        def any_of(lookup):
            value = 0
            for part in parts:
                value = part(lookup)
                if value:
                    return value
            return value
        return any_of
    if isinstance(node, ast.IfExp):
        test, body, orelse = (_compile(n, names) for n in (node.test, node.body, node.orelse))
        return lambda lookup: body(lookup) if test(lookup) else orelse(lookup)
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            shown = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise _Refused(f"the call of {shown!r} is not allowed (allowed: {', '.join(FUNCTIONS)})")
        if node.keywords:
            raise _Refused(f"{node.func.id}() takes no keyword arguments")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise _Refused(f"{node.func.id}() takes no *arguments")
        fn = FUNCTIONS[node.func.id]
        args = tuple(_compile(a, names) for a in node.args)
        return lambda lookup: fn(*(a(lookup) for a in args))
    raise _Refused(f"{type(node).__name__} ({ast.unparse(node)!r}) is not allowed in an expression")


class Expression:
    """One parsed byte expression: its text, the record it belongs to, and the names it reads."""

    __slots__ = ("text", "record", "names", "_fn")

    def __init__(self, text: Union[str, int, float], record: str = "<expression>"):
        self.record = record
        if isinstance(text, bool) or not isinstance(text, (str, int, float)):
            raise ExpressionError(f"{record}: an expression must be a string or a number, got {text!r}")
        self.text = str(text)
        try:
            tree = ast.parse(self.text.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(f"{record}: expression {self.text!r} does not parse: {exc.msg}"
                                  f"{'' if exc.offset is None else f' (at column {exc.offset})'}") from None
        names: set = set()
        try:
            self._fn = _compile(tree, names)
        except _Refused as exc:
            raise ExpressionError(f"{record}: expression {self.text!r}: {exc}") from None
        self.names: FrozenSet[str] = frozenset(names)

    def __repr__(self) -> str:
        return f"Expression({self.text!r}, record={self.record!r})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Expression) and (self.text, self.record) == (other.text, other.record)

    def __hash__(self) -> int:
        return hash((self.text, self.record))

    def check_names(self, known: Iterable[str]) -> None:
        """Refuse a name outside *known*, naming the record, the expression and the closest known names."""
        known = set(known)
        for name in sorted(self.names - known):
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ExpressionError(f"{self.record}: expression {self.text!r} reads the unknown name "
                                  f"{name!r}{hint} (declare it under 'values:' of the op records)")

    def evaluate(self, lookup: Lookup) -> Number:
        """The expression's value, names read from *lookup* (a mapping or a function of a name)."""
        get = lookup.__getitem__ if isinstance(lookup, Mapping) else lookup
        try:
            return self._fn(get)
        except ExpressionError:
            raise
        except KeyError as exc:
            detail = exc.args[0] if exc.args else ""
            if isinstance(detail, str) and " " not in detail:
                detail = f"unknown name {detail!r}"
            raise ExpressionError(f"{self.record}: expression {self.text!r}: {detail}") from None
        except (ZeroDivisionError, ValueError, TypeError, OverflowError) as exc:
            raise ExpressionError(f"{self.record}: expression {self.text!r} failed: {exc}") from None

    __call__ = evaluate


def evaluate(text: Union[str, int, float], values: Lookup, record: str = "<expression>") -> Number:
    """Parse and evaluate *text* once (for tests and one-off use)."""
    return Expression(text, record).evaluate(values)


def parse(text: Union[str, int, float], record: str = "<expression>",
          known: Optional[Iterable[str]] = None) -> Expression:
    """Parse *text*; where *known* is given, refuse names outside it."""
    expression = Expression(text, record)
    if known is not None:
        expression.check_names(known)
    return expression
