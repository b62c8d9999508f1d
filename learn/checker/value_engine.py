"""A scalar autograd engine like the exercise's Value, with switches that reproduce the known mistakes.

The checker runs each test expression on ``RefValue`` under every mistake's switches and compares the gradients
with the learner's: the one that matches names the mistake.  The graph is built exactly as the exercise's given
code builds it (``a - b`` is ``a + (b * -1)``, ``a / b`` is ``a * b ** -1``), so the walks visit the same nodes.
"""

from __future__ import annotations

import math
from collections import deque


class Switches:
    """The mistakes to make; the defaults make none."""

    walk = "topo"  # "topo" | "preorder" | "preorder-lifo" | "bfs" | "recursive" | "not-reversed"
    overwrite = False  # grads assigned (=) instead of added (+=): in every _backward (True) or in one ("add", ...)
    seed = True  # backward() sets the output's grad to 1
    mul_own = False  # a * b gives a the gradient a.data * out.grad
    tanh_input = False  # tanh' as 1 - x**2
    pow_no_minus_one = False  # (x**n)' as n * x**n
    pow_no_n = False  # (x**n)' as x**(n - 1)

    def __init__(self, **kw):
        for k, v in kw.items():
            if not hasattr(Switches, k):
                raise ValueError(f"no switch {k!r}")
            setattr(self, k, v)


def engine(switches: Switches) -> type:
    """A Value class that makes the mistakes ``switches`` asks for."""
    s = switches

    class RefValue:
        def __init__(self, data, _prev=()):
            self.data, self.grad, self._prev = float(data), 0.0, tuple(_prev)
            self._backward = lambda: None

        def _give(self, node, g, op=""):
            node.grad = g if s.overwrite is True or s.overwrite == op else node.grad + g

        def __add__(self, other):
            other = other if isinstance(other, RefValue) else RefValue(other)
            out = RefValue(self.data + other.data, (self, other))

            def _backward():
                self._give(self, out.grad, "add")
                self._give(other, out.grad, "add")

            out._backward = _backward
            return out

        def __mul__(self, other):
            other = other if isinstance(other, RefValue) else RefValue(other)
            out = RefValue(self.data * other.data, (self, other))

            def _backward():
                self._give(self, (self.data if s.mul_own else other.data) * out.grad, "mul")
                self._give(other, (other.data if s.mul_own else self.data) * out.grad, "mul")

            out._backward = _backward
            return out

        def __pow__(self, n):
            out = RefValue(self.data**n, (self,))

            def _backward():
                local = n * self.data ** (n if s.pow_no_minus_one else n - 1)
                self._give(self, (self.data ** (n - 1) if s.pow_no_n else local) * out.grad, "pow")

            out._backward = _backward
            return out

        def tanh(self):
            t = math.tanh(self.data)
            out = RefValue(t, (self,))

            def _backward():
                self._give(self, (1 - (self.data if s.tanh_input else t) ** 2) * out.grad, "tanh")

            out._backward = _backward
            return out

        def exp(self):
            e = math.exp(self.data)
            out = RefValue(e, (self,))

            def _backward():
                self._give(self, e * out.grad, "exp")

            out._backward = _backward
            return out

        def backward(self):
            if s.seed:
                self.grad = 1.0
            for node in _walk(self, s.walk):
                node._backward()

        def __neg__(self):
            return self * -1

        def __radd__(self, other):
            return self + other

        def __sub__(self, other):
            return self + (-other)

        def __rsub__(self, other):
            return other + (-self)

        def __rmul__(self, other):
            return self * other

        def __truediv__(self, other):
            return self * other**-1

        def __rtruediv__(self, other):
            return other * self**-1

    return RefValue


def _topo(root) -> list:
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((p, False) for p in node._prev if id(p) not in seen)
    return order


def _walk(root, how: str):
    """The nodes in the order a backward of kind ``how`` calls their _backward."""
    if how == "topo":
        return reversed(_topo(root))
    if how == "not-reversed":
        return _topo(root)
    if how in ("preorder", "preorder-lifo"):  # depth first, each node once, as soon as it is reached (its inputs
        order, seen, stack = [], set(), [root]  # pushed so that the first is popped first, or the last)
        while stack:
            node = stack.pop()
            if id(node) not in seen:
                seen.add(id(node))
                order.append(node)
                stack.extend(reversed(node._prev) if how == "preorder" else node._prev)
        return order
    if how == "bfs":
        order, seen, queue = [], {id(root)}, deque([root])
        while queue:
            node = queue.popleft()
            order.append(node)
            for p in node._prev:
                if id(p) not in seen:
                    seen.add(id(p))
                    queue.append(p)
        return order
    if how == "recursive":  # node._backward(), then every input's, again and again through a shared node
        order, stack = [], [root]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(node._prev))
        return order
    raise ValueError(how)
