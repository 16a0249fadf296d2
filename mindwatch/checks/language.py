"""The rule language of ``mindwatch check``: a tokenizer and parser of its own, never ``eval``.

Example::

    from mindwatch.checks.language import parse_rule
    rule = parse_rule("max(grad_norm, last=100) < 1e5 and final(loss) < first(loss)")
    rule.functions      # ('max', 'final', 'first')

Grammar (Python-like; ``and``/``or``/``not``, chained comparisons, ``+ - * / % **``)::

    rule       := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | comparison
    comparison := sum (("<" | "<=" | ">" | ">=" | "==" | "!=") sum)*
    sum        := product (("+" | "-") product)*
    product    := unary (("*" | "/" | "%") unary)*
    unary      := ("-" | "+") unary | power
    power      := atom ("**" unary)?
    atom       := NUMBER | STRING | true | false | nan | inf | call | "(" rule ")"
    call       := NAME "(" [METRIC ("," ...)] ["," NAME "=" rule]* ")"

A metric is a bare name (``loss``, ``eval/accuracy``, ``attention_entropy/blocks.0.attn``: letters, digits, ``_``,
and ``.`` or ``/`` between them) or a quoted string (any other name: ``'eval/top-1'``).
The parser only builds a small tree of the node classes below; :mod:`mindwatch.checks.evaluate`
evaluates it against a run. Nothing in a rule can reach Python: there are no attributes,
no subscripts, no lambdas and no names other than the functions in :data:`FUNCTIONS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Longest rule accepted, and deepest nesting: a rule is a one-liner, not a program.
MAX_RULE_LENGTH = 2000
MAX_DEPTH = 40


@dataclass(frozen=True)
class Signature:
    """What a rule function takes: a metric first or not, the options it accepts, its meaning."""

    metric: bool
    options: tuple[str, ...]
    doc: str
    positional: tuple[str, ...] = ()


_WINDOW = ("last", "rank")
#: Every function a rule may call. ``last=N``: the last N recorded values of each rank;
#: ``rank=R``: only rank R (default: every rank for aggregates, the lowest rank for first/final).
FUNCTIONS: dict[str, Signature] = {
    "final": Signature(True, ("rank",), "the last recorded value (lowest rank unless rank=R)"),
    "first": Signature(True, ("rank",), "the first recorded value (lowest rank unless rank=R)"),
    "best": Signature(
        True,
        ("rank",),
        "the best finite value (lowest rank unless rank=R): the smallest of a loss, the largest of a score such as "
        "an accuracy (metrics.eval_mode; the run's evaluation.mode for its primary metric)",
    ),
    "min": Signature(True, _WINDOW, "smallest value; NaN when any value in the window is NaN"),
    "max": Signature(True, _WINDOW, "largest value; NaN when any value in the window is NaN"),
    "mean": Signature(True, _WINDOW, "mean value"),
    "median": Signature(True, _WINDOW, "median value"),
    "std": Signature(True, _WINDOW, "standard deviation"),
    "sum": Signature(True, _WINDOW, "sum of the values"),
    "percentile": Signature(True, (*_WINDOW, "q"), "percentile q (0-100) of the values", positional=("q",)),
    "count": Signature(True, _WINDOW, "number of recorded values"),
    "nonfinite": Signature(True, _WINDOW, "number of NaN or infinite values"),
    "alerts": Signature(False, ("severity", "rule", "metric", "rank"), "number of alerts (filtered by the options)"),
    "steps": Signature(False, ("rank",), "the last step recorded"),
    "duration": Signature(False, (), "seconds from the run's start to its last record or end"),
    "state": Signature(False, (), "the run's state as a string: 'finished', 'failed', ..."),
    "abs": Signature(False, (), "absolute value of a number", positional=("x",)),
}


class RuleError(ValueError):
    """A rule that cannot be parsed or evaluated; ``position`` is the 0-based column of the problem."""

    def __init__(self, message: str, rule: str, position: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.rule = rule
        self.position = position

    def pointed(self) -> str:
        """The rule, a caret under the column at fault, and the message."""
        if self.position is None:
            return f"{self.rule}\n{self.message}"
        return f"{self.rule}\n{' ' * self.position}^\n{self.message} (column {self.position + 1})"

    def __str__(self) -> str:
        return self.pointed()


# -- syntax tree ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    pos: int


@dataclass(frozen=True)
class Constant(Node):
    value: float | str | bool


@dataclass(frozen=True)
class Unary(Node):
    op: str  # "-", "+", "not"
    operand: Node


@dataclass(frozen=True)
class Binary(Node):
    op: str  # "+", "-", "*", "/", "%", "**", "and", "or"
    left: Node
    right: Node


@dataclass(frozen=True)
class Compare(Node):
    first: Node
    ops: tuple[str, ...]
    rest: tuple[Node, ...]


@dataclass(frozen=True)
class Call(Node):
    end: int
    name: str
    metric: str | None
    args: tuple[Node, ...] = ()
    options: dict[str, Node] = field(default_factory=dict)


@dataclass(frozen=True)
class Name(Node):
    """A bare name (``lr``, ``optimizer.lr``): a column of the runs table, only where ``parse_rule(names=True)``."""

    name: str


@dataclass(frozen=True)
class CheckRule:
    """A parsed rule: its text and its tree."""

    text: str
    tree: Node

    @property
    def functions(self) -> tuple[str, ...]:
        out: list[str] = []

        def walk(n: Node) -> None:
            if isinstance(n, Call):
                out.append(n.name)
                for a in (*n.args, *n.options.values()):
                    walk(a)
            elif isinstance(n, Unary):
                walk(n.operand)
            elif isinstance(n, Binary):
                walk(n.left)
                walk(n.right)
            elif isinstance(n, Compare):
                for x in (n.first, *n.rest):
                    walk(x)

        walk(self.tree)
        return tuple(out)


# -- tokenizer ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Token:
    kind: str  # number, string, name, op, end
    text: str
    pos: int


_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'[^'\\\n]*'|"[^"\\\n]*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:[./][A-Za-z0-9_]+)*)
  | (?P<op>\*\*|<=|>=|==|!=|[<>()+\-*/%,=])
    """,
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "true", "false", "True", "False", "nan", "inf"}
#: Options whose value is text (a severity, a rule or a metric name): a bare word there wants quotes.
_TEXT_OPTIONS = {"severity", "rule", "metric"}


def tokenize(text: str) -> list[Token]:
    """Split a rule into tokens; an unknown character is a :class:`RuleError` at its column."""
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            ch = text[pos]
            hint = " (strings need matching quotes)" if ch in "'\"" else ""
            raise RuleError(f"unexpected character {ch!r}{hint}", text, pos)
        kind = m.lastgroup or ""
        if kind != "space":
            tokens.append(Token(kind, m.group(), pos))
        pos = m.end()
    tokens.append(Token("end", "", len(text)))
    return tokens


# -- parser ---------------------------------------------------------------------------------------
_COMPARE = ("<", "<=", ">", ">=", "==", "!=")


class _Parser:
    def __init__(self, text: str, names: bool = False) -> None:
        self.text = text
        self.names = names
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def error(self, message: str, tok: Token | None = None) -> RuleError:
        return RuleError(message, self.text, (tok or self.tok).pos)

    def take(self) -> Token:
        t = self.tokens[self.i]
        self.i += 1
        return t

    def accept(self, *texts: str) -> Token | None:
        t = self.tok
        if t.kind in ("op", "name") and t.text in texts:
            return self.take()
        return None

    def expect(self, text: str, what: str) -> Token:
        t = self.accept(text)
        if t is None:
            raise self.error(f"expected {what}, found {self.describe(self.tok)}")
        return t

    @staticmethod
    def describe(t: Token) -> str:
        return "the end of the rule" if t.kind == "end" else repr(t.text)

    def parse(self) -> Node:
        node = self.or_()
        if self.tok.kind != "end":
            raise self.error(f"unexpected {self.describe(self.tok)}: expected an operator or the end of the rule")
        return node

    def nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"rule nested deeper than {MAX_DEPTH} levels")

    def or_(self) -> Node:
        self.nested()
        node = self.and_()
        while t := self.accept("or"):
            node = Binary(t.pos, "or", node, self.and_())
        self.depth -= 1
        return node

    def and_(self) -> Node:
        node = self.not_()
        while t := self.accept("and"):
            node = Binary(t.pos, "and", node, self.not_())
        return node

    def not_(self) -> Node:
        if t := self.accept("not"):
            self.nested()
            node = Unary(t.pos, "not", self.not_())
            self.depth -= 1
            return node
        return self.comparison()

    def comparison(self) -> Node:
        first = self.sum_()
        ops: list[str] = []
        rest: list[Node] = []
        while self.tok.kind == "op" and self.tok.text in _COMPARE:
            ops.append(self.take().text)
            rest.append(self.sum_())
        if self.tok.kind == "op" and self.tok.text == "=":
            raise self.error("'=' is not a comparison: use '==' (options such as last=N go inside a call)")
        return Compare(first.pos, first, tuple(ops), tuple(rest)) if ops else first

    def sum_(self) -> Node:
        node = self.product()
        while t := self.accept("+", "-"):
            node = Binary(t.pos, t.text, node, self.product())
        return node

    def product(self) -> Node:
        node = self.unary()
        while t := self.accept("*", "/", "%"):
            node = Binary(t.pos, t.text, node, self.unary())
        return node

    def unary(self) -> Node:
        if t := self.accept("-", "+"):
            self.nested()
            node = Unary(t.pos, t.text, self.unary())
            self.depth -= 1
            return node
        return self.power()

    def power(self) -> Node:
        base = self.atom()
        if t := self.accept("**"):
            return Binary(t.pos, "**", base, self.unary())
        return base

    def atom(self) -> Node:
        t = self.tok
        if t.kind == "number":
            self.take()
            return Constant(t.pos, float(t.text))
        if t.kind == "string":
            self.take()
            return Constant(t.pos, t.text[1:-1])
        if t.kind == "op" and t.text == "(":
            self.take()
            node = self.or_()
            self.expect(")", "')' to close the '(' at column " + str(t.pos + 1))
            return node
        if t.kind == "name":
            if t.text in ("true", "True"):
                self.take()
                return Constant(t.pos, True)
            if t.text in ("false", "False"):
                self.take()
                return Constant(t.pos, False)
            if t.text == "nan":
                self.take()
                return Constant(t.pos, float("nan"))
            if t.text == "inf":
                self.take()
                return Constant(t.pos, float("inf"))
            if t.text in _KEYWORDS:
                raise self.error(f"expected a value, found {t.text!r}")
            return self.call()
        raise self.error(f"expected a value (a number, a string or a function call), found {self.describe(t)}")

    def call(self) -> Node:
        name_tok = self.take()
        sig = FUNCTIONS.get(name_tok.text)
        if sig is None:
            if self.tok.text == "(":
                raise self.error(f"unknown function {name_tok.text!r}; known: {', '.join(FUNCTIONS)}", name_tok)
            if self.names:
                return Name(name_tok.pos, name_tok.text)
            raise self.error(
                f"{name_tok.text!r} is not a value: metrics go inside a function, e.g. final({name_tok.text})", name_tok
            )
        self.expect("(", f"'(' after {name_tok.text!r}")
        metric: str | None = None
        args: list[Node] = []
        options: dict[str, Node] = {}
        if sig.metric:
            m = self.tok
            if m.kind == "name" and m.text not in _KEYWORDS and self.tokens[self.i + 1].text != "=":
                metric = self.take().text
            elif m.kind == "string":
                metric = self.take().text[1:-1]
            else:
                raise self.error(f"{name_tok.text}() needs a metric name first, e.g. {name_tok.text}(loss)")
        first = metric is None
        while not self.accept(")"):
            if not first:
                self.expect(",", f"',' or ')' in the call of {name_tok.text}()")
                if self.accept(")"):
                    break
            first = False
            if self.tok.kind == "name" and self.tokens[self.i + 1].text == "=":
                key = self.take()
                self.take()  # '='
                if key.text not in sig.options:
                    allowed = ", ".join(f"{o}=" for o in sig.options) or "none"
                    raise self.error(f"{name_tok.text}() has no option {key.text!r}; options: {allowed}", key)
                if key.text in options:
                    raise self.error(f"option {key.text!r} given twice", key)
                if key.text in _TEXT_OPTIONS and self.tok.kind == "name" and self.tokens[self.i + 1].text != "(":
                    raise self.error(f"{key.text}= takes a string in quotes: {key.text}='{self.tok.text}'", self.tok)
                options[key.text] = self.or_()
            else:
                if options:
                    raise self.error("a positional argument cannot follow an option")
                if len(args) >= len(sig.positional):
                    raise self.error(f"{name_tok.text}() takes no more positional arguments; use options such as last=N")
                args.append(self.or_())
        for p, name in enumerate(sig.positional):
            if p >= len(args) and name not in options:
                raise self.error(f"{name_tok.text}() needs {name} (e.g. {name_tok.text}(loss, 95))", name_tok)
        return Call(name_tok.pos, self.tokens[self.i - 1].pos + 1, name_tok.text, metric, tuple(args), options)


def parse_rule(text: str, *, names: bool = False) -> CheckRule:
    """Parse one rule; raises :class:`RuleError` pointing at the column at fault.

    ``names=True`` also accepts bare names (:class:`Name`), which the runs page's filter resolves to
    config keys, tags and summary columns (:mod:`mindwatch.checks.listing`).
    """
    if not isinstance(text, str):
        raise RuleError(f"a rule is a string, got {type(text).__name__}", str(text))
    if len(text) > MAX_RULE_LENGTH:
        raise RuleError(f"rule longer than {MAX_RULE_LENGTH} characters", text[:80] + "...", None)
    if not text.strip():
        raise RuleError("empty rule", text, 0)
    return CheckRule(text, _Parser(text, names).parse())
