"""A tiny imperative language that bebop parses and runs itself (never Python exec/eval).

    program := stmt (SEP stmt)*           SEP is a newline or ';' (blank ones allowed)
    stmt    := NAME '=' expr              assign
             | 'ret' expr                 return the value: the program's output
             | 'rep' expr '{' program '}' run the block expr times
             | 'while' expr '{' program '}'  run the block while expr != 0
    expr    := sum (CMP sum)?             CMP: < <= > >= == != (gives 1 or 0)
    sum     := term (('+' | '-') term)*
    term    := unary (('*' | '/' | '%') unary)*   '/' and '%' floor, as in Python
    unary   := '-' unary | NUMBER | NAME | '(' expr ')'

Integers only. The input is the variable `x`. Limits make every run finish fast: source
length, nesting depth, a step budget (statements and expression nodes), a wall-clock
deadline and a bound on magnitudes. Every failure -- syntax, unknown variable, division
by zero, no `ret`, a limit -- raises `CodeError` with a one-line message naming the line.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

MAX_SOURCE_CHARS = 1000
MAX_DEPTH = 40
MAX_STEPS = 10_000
TIME_LIMIT_S = 0.05
MAX_MAGNITUDE = 10**9

KEYWORDS = ("ret", "rep", "while")
COMPARISONS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
               ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
ARITHMETIC = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
              "/": lambda a, b: a // b, "%": lambda a, b: a % b}
_TOKEN = re.compile(r"(?P<num>\d+)|(?P<name>[a-z_][a-z0-9_]*)|(?P<op><=|>=|==|!=|[-+*/%<>=(){};\n])"
                    r"|(?P<space>[ \t]+)")


class CodeError(Exception):
    """The program is invalid or was cut off; it scores 0."""


@dataclass(frozen=True)
class Tok:
    kind: str  # "num", "name", "op", "end"
    text: str
    line: int


def tokenize(source: str) -> list[Tok]:
    if len(source) > MAX_SOURCE_CHARS:
        raise CodeError(f"program too long ({len(source)} chars, max {MAX_SOURCE_CHARS})")
    toks, pos, line = [], 0, 1
    while pos < len(source):
        match = _TOKEN.match(source, pos)
        if not match:
            raise CodeError(f"line {line}: unexpected character {source[pos]!r}")
        kind = match.lastgroup
        assert kind is not None  # every alternative of _TOKEN is a named group
        if kind != "space":
            toks.append(Tok(kind, match.group(), line))
        line += match.group() == "\n"
        pos = match.end()
    toks.append(Tok("end", "", line))
    return toks


class _Parser:
    """Recursive descent over the token list; builds tuples: ("num", v), ("var", n), ..."""

    def __init__(self, toks: list[Tok]) -> None:
        self.toks, self.i, self.depth = toks, 0, 0

    @property
    def tok(self) -> Tok:
        return self.toks[self.i]

    def fail(self, what: str) -> CodeError:
        got = repr(self.tok.text) if self.tok.kind != "end" else "end of program"
        return CodeError(f"line {self.tok.line}: expected {what}, got {got}")

    def take(self, text: str) -> None:
        if self.tok.text != text or self.tok.kind == "end":
            raise self.fail(repr(text))
        self.i += 1

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CodeError(f"line {self.tok.line}: nested too deeply (max {MAX_DEPTH})")

    def skip_separators(self) -> None:
        while self.tok.text in ("\n", ";") and self.tok.kind == "op":
            self.i += 1

    def program(self, closer: str) -> list[tuple]:
        stmts = []
        self.skip_separators()
        while self.tok.text != closer or self.tok.kind not in ("op", "end"):
            if self.tok.kind == "end":
                raise self.fail(repr(closer))
            stmts.append(self.stmt())
            if self.tok.text not in ("\n", ";", closer):
                raise self.fail(repr(closer) if self.tok.kind == "end" else "a new line or ';'")
            self.skip_separators()
        return stmts

    def block(self) -> list[tuple]:
        self.nest()
        self.take("{")
        body = self.program("}")
        self.take("}")
        self.depth -= 1
        return body

    def stmt(self) -> tuple:
        tok = self.tok
        if tok.kind == "name" and tok.text in ("rep", "while"):
            self.i += 1
            return (tok.text, tok.line, self.expr(), self.block())
        if tok.kind == "name" and tok.text == "ret":
            self.i += 1
            return ("ret", tok.line, self.expr())
        if tok.kind == "name":
            self.i += 1
            self.take("=")
            return ("set", tok.line, tok.text, self.expr())
        raise self.fail("a statement (NAME = ..., ret, rep, while)")

    def expr(self) -> tuple:
        left = self.binary(0)
        if self.tok.kind == "op" and self.tok.text in COMPARISONS:
            op = self.tok.text
            self.i += 1
            left = ("bin", op, left, self.binary(0))
        return left

    LEVELS = (("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> tuple:
        if level == len(self.LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.tok.kind == "op" and self.tok.text in self.LEVELS[level]:
            op = self.tok.text
            self.i += 1
            left = ("bin", op, left, self.binary(level + 1))
        return left

    def unary(self) -> tuple:
        tok = self.tok
        if tok.kind == "op" and tok.text in ("-", "("):
            self.nest()
            self.i += 1
            node = ("neg", self.unary()) if tok.text == "-" else self.expr()
            if tok.text == "(":
                self.take(")")
            self.depth -= 1
            return node
        if tok.kind == "num":
            self.i += 1
            return ("num", int(tok.text[:12]) if len(tok.text) <= 12 else MAX_MAGNITUDE + 1)
        if tok.kind == "name" and tok.text not in KEYWORDS:
            self.i += 1
            return ("var", tok.text)
        raise self.fail("a number, a name or '('")


def parse_program(source: str) -> list[tuple]:
    parser = _Parser(tokenize(source))
    stmts = parser.program("")
    if not stmts:
        raise CodeError("empty program")
    return stmts


def parse_expression(source: str) -> tuple:
    """One expression with no statements (the agent task's calculator)."""
    parser = _Parser(tokenize(source))
    node = parser.expr()
    if parser.tok.kind != "end":
        raise parser.fail("end of expression")
    return node


class _Return(Exception):
    def __init__(self, value: int) -> None:
        self.value = value


class _Machine:
    """Runs a parsed program under the step budget and deadline."""

    def __init__(self, env: dict[str, int], max_steps: int, time_limit_s: float) -> None:
        self.env, self.steps_left = env, max_steps
        self.deadline = time.monotonic() + time_limit_s
        self.line = 1

    def tick(self) -> None:
        self.steps_left -= 1
        if self.steps_left < 0:
            raise CodeError(f"line {self.line}: step limit reached")
        if self.steps_left % 256 == 0 and time.monotonic() > self.deadline:
            raise CodeError(f"line {self.line}: time limit reached")

    def run(self, stmts: list[tuple]) -> None:
        for stmt in stmts:
            self.tick()
            self.line = stmt[1]
            kind = stmt[0]
            if kind == "set":
                self.env[stmt[2]] = self.eval(stmt[3])
            elif kind == "ret":
                raise _Return(self.eval(stmt[2]))
            elif kind == "rep":
                for _ in range(self.eval(stmt[2])):
                    self.run(stmt[3])
            else:  # while
                while self.eval(stmt[2]) != 0:
                    self.run(stmt[3])

    def eval(self, node: tuple) -> int:
        self.tick()
        kind = node[0]
        if kind == "num":
            value = node[1]
        elif kind == "var":
            if node[1] not in self.env:
                raise CodeError(f"line {self.line}: unknown variable {node[1]!r}")
            value = self.env[node[1]]
        elif kind == "neg":
            value = -self.eval(node[1])
        else:
            value = _apply(node[1], self.eval(node[2]), self.eval(node[3]), self.line)
        if abs(value) > MAX_MAGNITUDE:
            raise CodeError(f"line {self.line}: number too large")
        return value


def _apply(op: str, a: int, b: int, line: int) -> int:
    if op in COMPARISONS:
        return int(COMPARISONS[op](a, b))
    if op in ("/", "%") and b == 0:
        raise CodeError(f"line {line}: division by zero")
    return ARITHMETIC[op](a, b)


def run_program(stmts: list[tuple], x: int, max_steps: int = MAX_STEPS,
                time_limit_s: float = TIME_LIMIT_S) -> int:
    """Run a parsed program on input x; its `ret` value, or CodeError."""
    machine = _Machine({"x": x}, max_steps, time_limit_s)
    try:
        machine.run(stmts)
    except _Return as ret:
        return ret.value
    except RecursionError:  # a long chain like 1+1+...+1 is a deep tree
        raise CodeError("program nested too deeply") from None
    raise CodeError("program ended without 'ret'")


def evaluate_expression(source: str, max_steps: int = MAX_STEPS) -> int:
    """Evaluate a variable-free expression, e.g. '3*4+2*5'; CodeError when invalid."""
    try:
        return _Machine({}, max_steps, TIME_LIMIT_S).eval(parse_expression(source))
    except RecursionError:
        raise CodeError("expression nested too deeply") from None
