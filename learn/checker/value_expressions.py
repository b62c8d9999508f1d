"""The expressions the value exercise is checked on, and how one runs on a Value class: all that the learner's
process needs of the value check (the reference engine and the known mistakes stay in the checker's process).

Each expression isolates an operation, a node used twice, a diamond or a deep chain; it runs on the learner's
Value, on 0-d float64 torch tensors (autograd gives the expected gradients) and on the checker's reference engine.
"""

from __future__ import annotations

from .guard import LearnerFailed, call

A, B = 0.8, -1.7
DEPTH = 1500  # a chain deeper than Python's recursion limit (about 1,000)


def deep(a, b):
    x = a
    for _ in range(DEPTH):
        x = x * 0.999 + b * 0.001
    return x


_ORDER = "backward(): the walk's order (reverse topological), and += in every _backward"
EXPRESSIONS = [  # (what it tests, f(a, b), where to look when it fails); each f runs on Values and torch tensors
    ("a + b", lambda a, b: a + b, "__add__'s _backward"),
    ("a * b", lambda a, b: a * b, "__mul__'s _backward"),
    ("a ** 3", lambda a, b: a**3, "__pow__'s _backward"),
    ("a.tanh()", lambda a, b: a.tanh(), "tanh's _backward"),
    ("b.exp()", lambda a, b: b.exp(), "exp's _backward"),
    (
        "2 * a - b / 4 + 1 / a - 3  (numbers on either side; - and / as given)",
        lambda a, b: 2 * a - b / 4 + 1 / a - 3,
        "__add__, __mul__ and __pow__: - and / are made of them",
    ),
    ("a * a  (one node used twice by one operation)", lambda a, b: a * a, "+= in __mul__'s _backward"),
    ("a + a  (the same, through an addition)", lambda a, b: a + a, "+= in __add__'s _backward"),
    (
        "c = a * b; c.tanh() * c.exp()  (a diamond: c feeds two nodes)",
        lambda a, b: (lambda c: c.tanh() * c.exp())(a * b),
        _ORDER,
    ),
    (
        "c = a + b; c + (c * 2).tanh()  (an uneven diamond: one short path, one long)",
        lambda a, b: (lambda c: c + (c * 2).tanh())(a + b),
        _ORDER,
    ),
    (
        "(a * 0.5 + b * -1.5 + 0.3).tanh()  (a neuron)",
        lambda a, b: (a * 0.5 + b * -1.5 + 0.3).tanh(),
        "the operations above",
    ),
    (
        f"x = a, then x = x * 0.999 + b * 0.001, {DEPTH} times  (a graph {2 * DEPTH} nodes deep)",
        deep,
        "backward(): does the walk reach every node of a deep graph?",
    ),
]


def run(cls, f, where=None):
    """(out.data, a.grad, b.grad) of the expression on the Value class ``cls``."""
    a = call(f"{cls.__name__}({A})", cls, A, where=where)
    b = call(f"{cls.__name__}({B})", cls, B, where=where)
    out = call(f"building the expression with your {cls.__name__}", f, a, b, where=where)
    call(f"{cls.__name__}.backward", out.backward, where=where)
    return tuple(_number(v) for v in (out.data, a.grad, b.grad))


def _number(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        raise LearnerFailed(f"a .data or .grad is {type(v).__name__}, not a number") from None
