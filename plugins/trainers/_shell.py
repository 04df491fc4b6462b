"""What a launch script passes to its training program: the bash subset such scripts are written in.

Megatron-LM's example launchers (examples/*/train_*.sh) set variables (``TP=8``,
``${1:-default}``, ``$((A*B))``), collect flags in bash arrays (``ARGS=( ... )``,
``ARGS+=( ... )``), choose some under ``if [[ ... ]]`` and finally run
``torchrun ... pretrain_gpt.py ${ARGS[@]}``. :func:`program_arguments` follows
that: it expands words as bash does (quotes, field splitting of unquoted
expansions, ``"${A[@]}"``) and evaluates the tests it can decide. A test it
cannot decide (a file test, a variable the script never sets) runs both
branches, as two "worlds"; the caller compares what each world passes.
A value it cannot know (a positional argument, ``$(command)``, an environment
variable) stays a placeholder naming it (:func:`unknown_names`), so the caller
refuses it only where it bears on the cost. Loops, ``case`` and functions are
refused by line: no launcher the readers were checked on uses them.
"""
from __future__ import annotations

import ast
import operator
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import attrs

__all__ = ["ShellError", "World", "program_arguments", "split_words", "unknown_names", "MARK"]

MARK = "\x00"  # placeholder delimiters: MARK + "$1" + MARK stands for a value the script does not state
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", re.S)
_MAX_WORLDS = 64
_REFUSED_KEYWORDS = ("for", "while", "until", "case", "function", "select")


class ShellError(Exception):
    """A construct the reader does not interpret, with its line (the caller words the refusal)."""


# --- tokens ------------------------------------------------------------------------------------------------
@attrs.frozen
class Part:
    kind: str    # lit | var | cmd | arith
    text: str    # literal text, variable expression (inside ${}), command or arithmetic expression
    quoted: bool


@attrs.frozen
class Word:
    parts: Tuple[Part, ...]
    line: int

    def literal(self) -> Optional[str]:
        """The word's text where it is one unquoted literal (a keyword candidate), else None."""
        if len(self.parts) == 1 and self.parts[0].kind == "lit" and not self.parts[0].quoted:
            return self.parts[0].text
        return None


@attrs.frozen
class Op:
    text: str
    line: int


@attrs.frozen
class ArrayAssign:
    name: str
    append: bool
    words: Tuple[Word, ...]
    line: int


Token = Union[Word, Op, ArrayAssign]


class _Lexer:
    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.line = 1

    def error(self, what: str) -> ShellError:
        return ShellError(f"line {self.line}: {what}")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def tokens(self) -> List[Token]:
        out: List[Token] = []
        in_test = False  # inside [[ ... ]]: && || ( ) < > are words
        while self.i < len(self.s):
            c = self.peek()
            if c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c in " \t\r":
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            elif c == "\n":
                out.append(Op("\n", self.line))
                self.i += 1
                self.line += 1
            elif not in_test and self.s.startswith(("&&", "||", ";;"), self.i):
                out.append(Op(self.s[self.i:self.i + 2], self.line))
                self.i += 2
            elif c == ";" or (not in_test and c in "|&()"):
                out.append(Op(c, self.line))
                self.i += 1
            elif not in_test and c in "<>":
                while self.peek() and self.peek() in "<>&":
                    self.i += 1
                out.append(Op("redirect", self.line))
            else:
                start = self.i
                word = self.word(in_test)
                if self.i == start:
                    raise self.error(f"unexpected {c!r}")
                text = word.literal()
                if text == "[[":
                    in_test = True
                elif text == "]]":
                    in_test = False
                match = _ASSIGN.fullmatch(text or "")
                if match and not match.group(3) and self.peek() == "(":
                    out.append(self.array(match.group(1), bool(match.group(2)), word.line))
                elif text is not None and text.isdigit() and self.peek() and self.peek() in "<>":
                    continue  # the fd of a redirection (2>&1)
                else:
                    out.append(word)
        return out

    def array(self, name: str, append: bool, line: int) -> ArrayAssign:
        self.i += 1  # the "("
        words: List[Word] = []
        while True:
            c = self.peek()
            if not c:
                raise self.error(f"the array {name}=( has no closing parenthesis")
            if c == ")":
                self.i += 1
                return ArrayAssign(name, append, tuple(words), line)
            if c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c in " \t\r":
                self.i += 1
            elif c == "\n":
                self.i += 1
                self.line += 1
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            else:
                start = self.i
                words.append(self.word(True, stop=")"))
                if self.i == start:
                    raise self.error(f"unexpected {c!r} in the array {name}=(")

    def word(self, in_test: bool, stop: str = "") -> Word:
        parts: List[Part] = []
        buf: List[str] = []
        line = self.line
        breaks = " \t\r\n;" + stop + ("" if in_test else "|&()<>")

        def flush(quoted: bool = False):
            if buf:
                parts.append(Part("lit", "".join(buf), quoted))
                buf.clear()

        while self.i < len(self.s):
            c = self.peek()
            if c in breaks:
                break
            if c == "\\":
                nxt = self.peek(1)
                self.i += 2
                if nxt == "\n":
                    self.line += 1
                    continue
                flush()
                parts.append(Part("lit", nxt, True))
            elif c == "'":
                flush()
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    raise self.error("a single quote is not closed")
                text = self.s[self.i + 1:end]
                self.line += text.count("\n")
                parts.append(Part("lit", text, True))
                self.i = end + 1
            elif c == '"':
                flush()
                self.i += 1
                parts.extend(self.double_quoted())
            elif c == "$" or c == "`":
                flush()
                parts.append(self.dollar(quoted=False))
            else:
                buf.append(c)
                self.i += 1
        flush()
        return Word(tuple(parts), line)

    def double_quoted(self) -> List[Part]:
        parts: List[Part] = []
        buf: List[str] = []
        while True:
            c = self.peek()
            if not c:
                raise self.error("a double quote is not closed")
            if c == '"':
                self.i += 1
                break
            if c == "\\" and self.peek(1) and self.peek(1) in '$`"\\\n':
                if self.peek(1) == "\n":
                    self.line += 1
                else:
                    buf.append(self.peek(1))
                self.i += 2
            elif c == "$" or c == "`":
                if buf:
                    parts.append(Part("lit", "".join(buf), True))
                    buf = []
                parts.append(self.dollar(quoted=True))
            else:
                if c == "\n":
                    self.line += 1
                buf.append(c)
                self.i += 1
        if buf or not parts:
            parts.append(Part("lit", "".join(buf), True))
        return parts

    def dollar(self, quoted: bool) -> Part:
        if self.peek() == "`":
            end = self.s.find("`", self.i + 1)
            if end < 0:
                raise self.error("a backquote is not closed")
            text = self.s[self.i + 1:end]
            self.i = end + 1
            return Part("cmd", text, quoted)
        nxt = self.peek(1)
        if self.s.startswith("$((", self.i):
            self.i += 3
            return Part("arith", self.balanced("(", ")", 2)[:-1], quoted)
        if nxt == "(":
            self.i += 2
            return Part("cmd", self.balanced("(", ")", 1), quoted)
        if nxt == "{":
            self.i += 2
            return Part("var", self.balanced("{", "}", 1), quoted)
        match = _NAME.match(self.s, self.i + 1)
        if match:
            self.i = match.end()
            return Part("var", match.group(0), quoted)
        if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            self.i += 2
            return Part("var", nxt, quoted)
        self.i += 1
        return Part("lit", "$", quoted)

    def balanced(self, open_: str, close: str, depth: int) -> str:
        start = self.i
        while depth:
            c = self.peek()
            if not c:
                raise self.error(f"'{open_}' is not closed")
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
            elif c == "\n":
                self.line += 1
            self.i += 1
        return self.s[start:self.i - 1]


# --- statements --------------------------------------------------------------------------------------------
@attrs.frozen
class Simple:
    words: Tuple[Word, ...]
    line: int


@attrs.frozen
class Chain:
    """Commands joined by && / || (a pipeline counts as one command that succeeds)."""
    commands: Tuple[Any, ...]
    ops: Tuple[str, ...]


@attrs.frozen
class If:
    branches: Tuple[Tuple[Tuple[Any, ...], Tuple[Any, ...]], ...]  # (condition, body) for if and each elif
    otherwise: Tuple[Any, ...]
    line: int


class _Parser:
    def __init__(self, tokens: List[Token]):
        self.t = tokens
        self.i = 0

    def peek(self) -> Optional[Token]:
        return self.t[self.i] if self.i < len(self.t) else None

    def keyword(self) -> Optional[str]:
        tok = self.peek()
        return tok.literal() if isinstance(tok, Word) else None

    def statements(self, until: Sequence[str] = ()) -> Tuple[Any, ...]:
        out: List[Any] = []
        while True:
            tok = self.peek()
            if isinstance(tok, Op) and tok.text in ("\n", ";", "&"):
                self.i += 1
                continue
            if tok is None or (self.keyword() in until and until):
                return tuple(out)
            out.append(self.chain())

    def chain(self) -> Any:
        commands = [self.command()]
        ops: List[str] = []
        while True:
            tok = self.peek()
            if isinstance(tok, Op) and tok.text == "|":
                self.i += 1
                self.command()
                commands[-1] = Simple((), _line(tok))  # a pipeline: succeeds, sets nothing
            elif isinstance(tok, Op) and tok.text in ("&&", "||"):
                self.i += 1
                while isinstance(self.peek(), Op) and self.peek().text == "\n":  # type: ignore[union-attr]
                    self.i += 1
                ops.append(tok.text)
                commands.append(self.command())
            else:
                break
        return commands[0] if not ops else Chain(tuple(commands), tuple(ops))

    def command(self) -> Any:
        tok = self.peek()
        word = self.keyword()
        if word == "if":
            return self.if_()
        if word in _REFUSED_KEYWORDS or (isinstance(tok, Op) and tok.text in ("(", "{")):
            raise ShellError(f"line {_line(tok)}: '{word or tok.text}' is not read")  # type: ignore[union-attr]
        if isinstance(tok, ArrayAssign):
            self.i += 1
            return tok
        words: List[Word] = []
        line = _line(tok)
        while True:
            tok = self.peek()
            if isinstance(tok, Word):
                words.append(tok)
                self.i += 1
                if tok.literal() == "{" or (isinstance(self.peek(), Op) and self.peek().text == "("  # type: ignore
                                           and len(words) == 1):
                    raise ShellError(f"line {tok.line}: a function definition is not read")
            elif isinstance(tok, Op) and tok.text == "redirect":
                self.i += 2  # the operator and its target
            else:
                break
        if not words and isinstance(tok, Op) and tok.text not in ("\n", ";", "&"):
            raise ShellError(f"line {tok.line}: unexpected '{tok.text}'")
        return Simple(tuple(words), line)

    def expect(self, keyword: str, line: int) -> None:
        if self.keyword() != keyword:
            raise ShellError(f"line {line}: 'if' without its '{keyword}'")
        self.i += 1

    def if_(self) -> If:
        line = _line(self.peek())
        self.i += 1
        branches = []
        otherwise: Tuple[Any, ...] = ()
        while True:
            condition = self.statements(("then",))
            self.expect("then", line)
            body = self.statements(("elif", "else", "fi"))
            branches.append((condition, body))
            word = self.keyword()
            self.i += 1
            if word == "elif":
                continue
            if word == "else":
                otherwise = self.statements(("fi",))
                self.expect("fi", line)
            elif word != "fi":
                raise ShellError(f"line {line}: 'if' without its 'fi'")
            return If(tuple(branches), otherwise, line)


def _line(tok: Optional[Token]) -> int:
    return getattr(tok, "line", 0)


# --- expansion ---------------------------------------------------------------------------------------------
def unknown_names(text: str) -> List[str]:
    """The names of the unstated values a word holds (``$1``, ``$(dirname ...)``, ``$HOME``)."""
    pieces = text.split(MARK)
    return pieces[1::2]


def _unknown(what: str) -> str:
    return f"{MARK}{what}{MARK}"


@attrs.define
class World:
    """One run of the script: its variables, whether it exited, the tests it could not decide, its commands."""

    variables: Dict[str, Union[str, List[str]]] = attrs.field(factory=dict)
    exited: bool = False
    undecided: List[str] = attrs.field(factory=list)
    commands: List[Tuple[List[str], int]] = attrs.field(factory=list)

    def fork(self) -> "World":
        return World({k: list(v) if isinstance(v, list) else v for k, v in self.variables.items()},
                     self.exited, list(self.undecided), list(self.commands))

    # values
    def scalar(self, expr: str) -> Union[str, List[str]]:
        """``${expr}``'s value (a list for ``A[@]``)."""
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#?$!-])(?:\[(@|\*|\d+)\])?(.*)", expr, re.S)
        if not match:
            return _unknown("${" + expr + "}")
        name, index, rest = match.groups()
        value = self.variables.get(name)
        if rest:
            op = re.match(r":?[-=+?]", rest)
            if op is None:
                return _unknown("${" + expr + "}")
            arg = self.expand_text(rest[op.end():])
            empty = value is None or (op.group(0).startswith(":") and value in ("", []))
            kind = op.group(0)[-1]
            if kind in "-=":
                if empty:
                    if kind == "=":
                        self.variables[name] = arg
                    return arg
            elif kind == "+":
                return ("" if empty else arg)
            elif empty:
                return _unknown("$" + name)
        if value is None:  # an array the script never filled is empty; another name may come from the launcher
            return [] if index in ("@", "*") else _unknown("$" + name)
        if isinstance(value, list):
            if index in ("@", "*"):
                return list(value)
            k = int(index or 0)
            return (value[k] if k < len(value) else "")
        return (value if index in (None, "0", "@", "*") else "")

    def expand_text(self, text: str) -> str:
        """A word's text inside ``${...:-here}`` or an arithmetic expression, expanded as one string."""
        words = _Lexer(text).word(True).parts if text else ()
        return "".join(" ".join(v) if isinstance(v, list) else v for v in (self.part(p) for p in words))

    def part(self, part: Part) -> Union[str, List[str]]:
        if part.kind == "lit":
            return part.text
        if part.kind == "var":
            return self.scalar(part.text)
        if part.kind == "arith":
            return self.arithmetic(part.text)
        return _unknown("$(" + part.text.strip() + ")")

    def arithmetic(self, expr: str) -> str:
        text = self.expand_text(expr)
        text = _NAME.sub(lambda m: str(self.variables.get(m.group(0), "0")), text)
        if MARK in text:
            return _unknown("$((" + expr.strip() + "))")
        try:
            return str(_arith(ast.parse(text.strip(), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, TypeError, RecursionError):
            return _unknown("$((" + expr.strip() + "))")

    def words(self, word: Word) -> List[str]:
        """*word* expanded to the words bash passes: quoted parts kept whole, unquoted expansions split."""
        fields: List[str] = []
        current: List[str] = []
        keep = False  # the current field holds a quoted part, so it is a word even when empty

        def end_field():
            nonlocal current, keep
            if current or keep:
                fields.append("".join(current))
            current, keep = [], False

        for part in word.parts:
            value = self.part(part)
            if part.kind == "lit":
                current.append(value)  # type: ignore[arg-type]
                keep = keep or part.quoted
                continue
            pieces = value if isinstance(value, list) else [value]
            for n, piece in enumerate(pieces):
                if n:
                    end_field()
                if part.quoted:
                    current.append(piece)
                    keep = True
                    continue
                split = piece.split()
                if piece[:1].isspace():
                    end_field()
                for m, item in enumerate(split):
                    if m:
                        end_field()
                    current.append(item)
                if piece[-1:].isspace():
                    end_field()
            if part.quoted and isinstance(value, list) and not value:  # "${EMPTY[@]}" alone is no word at all
                keep = keep or bool(current)
        end_field()
        return fields


_ARITH_OPS: Dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def _arith(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
        return _ARITH_OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _arith(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError("not integer arithmetic")


# --- execution ---------------------------------------------------------------------------------------------
_QUIET = ("echo", "printf", "mkdir", "cd", "set", "shift", "source", ".", "unset", "ulimit", "sleep", "trap",
          "true", "wait", "cp", "rm", "ln", "touch", "cat", "tee", "pushd", "popd", "umask")


def _test(args: List[str]) -> Optional[bool]:
    """A ``[ ]`` / ``[[ ]]`` / ``test`` expression: True, False, or None where it cannot be decided."""
    def unknown(*values: str) -> bool:
        return any(MARK in v for v in values)

    def disjunction(items: List[str]) -> Optional[bool]:
        for op in ("||", "-o"):
            if op in items:
                k = items.index(op)
                left, right = conjunction(items[:k]), disjunction(items[k + 1:])
                if left is True or right is True:
                    return True
                return None if None in (left, right) else False
        return conjunction(items)

    def conjunction(items: List[str]) -> Optional[bool]:
        for op in ("&&", "-a"):
            if op in items and len(items) != 3:
                k = items.index(op)
                left, right = primary(items[:k]), conjunction(items[k + 1:])
                if left is False or right is False:
                    return False
                return None if None in (left, right) else True
        return primary(items)

    def primary(items: List[str]) -> Optional[bool]:
        if items[:1] == ["!"]:
            inner = primary(items[1:])
            return None if inner is None else not inner
        if items[:1] == ["("] and items[-1:] == [")"]:
            return disjunction(items[1:-1])
        if len(items) == 1:
            return None if unknown(items[0]) else bool(items[0])
        if len(items) == 2:
            op, value = items
            if op in ("-z", "-n"):
                if unknown(value):
                    return None
                return (value == "") == (op == "-z")
            return None  # file tests (-f, -d, -e, ...) and the like
        if len(items) == 3:
            left, op, right = items
            if unknown(left, right):
                return None
            if op in ("=", "=="):
                return left == right
            if op == "!=":
                return left != right
            numeric = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le,
                       "-gt": operator.gt, "-ge": operator.ge}
            if op in numeric:
                try:
                    return numeric[op](int(left), int(right))
                except ValueError:
                    return None
        return None

    return disjunction(args) if args else False


class _Runner:
    def __init__(self, is_program: Callable[[List[str]], bool]):
        self.is_program = is_program

    def block(self, worlds: List[World], statements: Sequence[Any]) -> List[World]:
        for statement in statements:
            out: List[World] = []
            for world in worlds:
                if world.exited:
                    out.append(world)
                    continue
                out.extend(w for w, _ in self.run(world, statement))
            if len(out) > _MAX_WORLDS:
                raise ShellError(f"more than {_MAX_WORLDS} combinations of undecided tests")
            worlds = out
        return worlds

    def run(self, world: World, statement: Any) -> List[Tuple[World, bool]]:
        """The worlds after *statement* and its exit status in each (a test ndcost cannot decide forks)."""
        if isinstance(statement, ArrayAssign):
            items = [w for word in statement.words for w in world.words(word)]
            old = world.variables.get(statement.name)
            if statement.append and old is not None:
                items = (old if isinstance(old, list) else [old]) + items
            world.variables[statement.name] = items
            return [(world, True)]
        if isinstance(statement, Chain):
            outcomes = self.run(world, statement.commands[0])
            for op, command in zip(statement.ops, statement.commands[1:], strict=True):
                step: List[Tuple[World, bool]] = []
                for w, status in outcomes:
                    if w.exited or status != (op == "&&"):
                        step.append((w, status))
                    else:
                        step.extend(self.run(w, command))
                if len(step) > _MAX_WORLDS:
                    raise ShellError(f"more than {_MAX_WORLDS} combinations of undecided tests")
                outcomes = step
            return outcomes
        if isinstance(statement, If):
            return self.if_(world, statement)
        return self.simple(world, statement)

    def if_(self, world: World, statement: If) -> List[Tuple[World, bool]]:
        (condition, body), rest = statement.branches[0], statement.branches[1:]
        out: List[Tuple[World, bool]] = []
        for w in self.block([world], condition[:-1]):
            for w2, status in (self.run(w, condition[-1]) if condition else [(w, True)]):
                if w2.exited:
                    out.append((w2, True))
                elif status:
                    out.extend((x, True) for x in self.block([w2], body))
                elif rest:
                    out.extend(self.if_(w2, If(rest, statement.otherwise, statement.line)))
                else:
                    out.extend((x, True) for x in self.block([w2], statement.otherwise))
        return out

    def simple(self, world: World, statement: Simple) -> List[Tuple[World, bool]]:
        words = list(statement.words)
        while words and (words[0].literal() or "").rstrip("!") in ("export", "local", "readonly", "declare"):
            words = words[1:]
            while words and (words[0].literal() or "").startswith("-"):
                words = words[1:]
        while words:
            match = _ASSIGN.fullmatch(_raw(words[0]))
            if not match:
                break
            name, append = match.group(1), bool(match.group(2))
            value = _joined(world, words[0], len(name) + len(match.group(2)) + 1)
            old = world.variables.get(name)
            if append and isinstance(old, list):
                old.append(value)
            else:
                world.variables[name] = (str(old) if append and old is not None else "") + value
            words = words[1:]
        if not words:
            return [(world, True)]
        args = [w for word in words for w in world.words(word)]
        if not args:
            return [(world, True)]
        head = args[0]
        if head in ("[", "[[", "test"):
            inner = args[1:-1] if head != "test" else args[1:]
            result = _test(inner)
            if result is None:
                text = " ".join(_shown(a) for a in args)
                other = world.fork()
                world.undecided.append(text)
                other.undecided.append(text)
                return [(world, True), (other, False)]
            return [(world, result)]
        if head == "!":
            return [(w, not s) for w, s in self.simple(world, Simple(statement.words[1:], statement.line))]
        if head == "false":
            return [(world, False)]
        if head == "exit" or head == "return":
            world.exited = True
            return [(world, True)]
        if head not in _QUIET and self.is_program(args):
            world.commands.append((args, statement.line))
        return [(world, True)]


def _raw(word: Word) -> str:
    """The leading unquoted literal of *word* (where an assignment's NAME= would be)."""
    first = word.parts[0] if word.parts else None
    return first.text if first is not None and first.kind == "lit" and not first.quoted else ""


def _strip_prefix(parts: Tuple[Part, ...], n: int) -> Tuple[Part, ...]:
    first = parts[0]
    rest = first.text[n:]
    return ((Part("lit", rest, False),) if rest else ()) + parts[1:]


def _joined(world: World, word: Word, n: int) -> str:
    """An assignment's value: the word after NAME=, expanded without field splitting (as bash assigns)."""
    parts = _strip_prefix(word.parts, n)
    out = []
    for part in parts:
        value = world.part(part)
        out.append(" ".join(value) if isinstance(value, list) else value)
    return "".join(out)


def _shown(text: str) -> str:
    return text.replace(MARK, "")


def split_words(text: str) -> List[str]:
    """An args file's words: comments and line continuations dropped, quotes removed, no expansion."""
    out: List[str] = []
    for tok in _Lexer(text).tokens():
        if isinstance(tok, Word):
            out.append("".join(p.text if p.kind == "lit" else ("${" + p.text + "}") for p in tok.parts))
    return out


def program_arguments(text: str, is_program: Callable[[List[str]], bool]) -> List[World]:
    """Every world's run of the script *text*: the commands *is_program* picks, with their expanded words."""
    statements = _Parser(_Lexer(text).tokens()).statements()
    return _Runner(is_program).block([World()], statements)
