"""Exercise value: write Value, a scalar that remembers how it was made and backpropagates (micrograd's).

    a, b = Value(2.0), Value(-3.0)
    c = a * b + a.tanh()
    c.backward()              # now a.grad = dc/da, b.grad = dc/db

Each operation returns a new Value that records what it was made from (_prev) and a closure _backward:
given the new node's .grad, it adds the local derivative times that into each input's .grad -- the chain
rule at one node.  backward() calls these closures from the output back to the inputs, in reverse
topological order: a node's _backward may run only when every node that uses it has added its share.
The two details that trip everyone up:
  * gradients are added (+=): a node used twice (a * a, or c used by two later nodes) receives both shares;
  * the walk must be in reverse topological order, and a graph can be thousands of nodes deep (Python's
    recursion stops near 1,000: build the order with an explicit stack).
What to write: the _backward of +, *, ** (a number exponent), tanh and exp, and backward().  The rest
(-, /, numbers on either side) is given, built from those.
{check}
"""
import math


class Value:
    def __init__(self, data, _prev=()):
        self.data = float(data)
        self.grad = 0.0
        self._prev = tuple(_prev)  # the Values this one was computed from
        self._backward = lambda: None  # adds self.grad * (local derivative) into each of _prev's .grad

    def __repr__(self):
        return f"Value(data={self.data}, grad={self.grad})"

    def __add__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data + other.data, (self, other))

        def _backward():
            # TODO: add d(out)/d(self) * out.grad into self.grad, and the same for other.
            ### BEGIN SOLUTION
            self.grad += out.grad
            other.grad += out.grad
            ### END SOLUTION
        out._backward = _backward
        return out

    def __mul__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data * other.data, (self, other))

        def _backward():
            # TODO: the same for out = self * other.
            ### BEGIN SOLUTION
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad
            ### END SOLUTION
        out._backward = _backward
        return out

    def __pow__(self, n):
        """self ** n for a plain number n."""
        assert isinstance(n, (int, float)), "only a number exponent"
        out = Value(self.data ** n, (self,))

        def _backward():
            # TODO: d(x^n)/dx times out.grad into self.grad.
            ### BEGIN SOLUTION
            self.grad += n * self.data ** (n - 1) * out.grad
            ### END SOLUTION
        out._backward = _backward
        return out

    def tanh(self):
        t = math.tanh(self.data)
        out = Value(t, (self,))

        def _backward():
            # TODO: d tanh(x)/dx, written with the output t, times out.grad into self.grad.
            ### BEGIN SOLUTION
            self.grad += (1 - t ** 2) * out.grad
            ### END SOLUTION
        out._backward = _backward
        return out

    def exp(self):
        e = math.exp(self.data)
        out = Value(e, (self,))

        def _backward():
            # TODO: d exp(x)/dx times out.grad into self.grad.
            ### BEGIN SOLUTION
            self.grad += e * out.grad
            ### END SOLUTION
        out._backward = _backward
        return out

    def backward(self):
        """Fill .grad of every node this one was computed from: d self / d node."""
        # TODO: put the nodes in topological order (every node after the nodes in its _prev) with an explicit
        #       stack, set self.grad = 1.0 (d self / d self), then call each node's _backward, the last first.
        ### BEGIN SOLUTION
        order, seen = [], set()
        stack = [(self, False)]
        while stack:  # depth first; a node goes into order once all its inputs are in
            node, inputs_done = stack.pop()
            if inputs_done:
                order.append(node)
            elif id(node) not in seen:
                seen.add(id(node))
                stack.append((node, True))
                stack.extend((p, False) for p in node._prev if id(p) not in seen)
        self.grad = 1.0
        for node in reversed(order):
            node._backward()
        ### END SOLUTION

    # given: built from the operations above
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
        return self * other ** -1

    def __rtruediv__(self, other):
        return other * self ** -1
