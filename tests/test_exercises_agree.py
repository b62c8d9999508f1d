"""The exercise and the library agree: each statement of an exercise solution's backward (learn/exercises/) appears in
the backward of handgrad's own layer, its textbook (the layer's file), so the two cannot drift apart.

Statements are compared as Python reads them (``ast``: the same code whatever its line breaks, spacing and
comments), with ``self.`` and ``saved.`` dropped on both sides -- the exercise keeps what its backward reads on the
layer, the layer in the ``Saved`` its forward returned.  Left out: the solution's accumulation into ``.grad`` (the
template does it for every layer) and its ``return``.  Where a layer that takes more than the exercise (strides,
dilation, padding, groups, any number of leading axes) writes a statement its own way, ``OTHERWISE`` says which
statement of the layer stands for it, and why; for those two exercises (conv2d, maxpool2d) the solution and the layer
are also run on the same input and compared in float64.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap

import pytest
import torch

import kernels
import layers.conv
from layers import BatchNorm1d, Conv2d, Embedding, LayerNorm, Linear, MaxPool2d, ReLU, Sigmoid, Tanh
from losses import CrossEntropyLoss

F64 = torch.float64

# exercise -> the functions whose source is the layer's textbook backward
LAYERS = {
    "linear": [Linear.backward_math],
    "relu": [ReLU.backward_math],
    "tanh": [Tanh.backward_math],
    "sigmoid": [Sigmoid.backward_math],
    "softmax_cross_entropy": [CrossEntropyLoss.backward_math],
    "layernorm": [LayerNorm.backward_math],
    "batchnorm": [BatchNorm1d.backward_math],
    "embedding": [Embedding.backward_math],
    "conv2d": [Conv2d.backward_math, layers.conv.conv2d_backward, layers.conv._offsets_backward],
    "maxpool2d": [MaxPool2d.backward_math],
}

# exercise -> {the solution's statement: (the layer's statement that stands for it, why)}
OTHERWISE = {
    "conv2d": {
        "k, p = kernel_size, padding": ("kh, kw = weight.shape[2:]", "kernels and paddings are pairs (rows, columns)"),
        "dxp = torch.zeros_like(xp)": (
            "dcols = torch.zeros_like(cols)",
            "im2col: the gradient of every window's column, folded back onto the input after the loop",
        ),
        "patch = xp[:, :, i:i + ho, j:j + wo]": (
            "patch = cols[:, :, i, j]",
            "what each output sees at offset (i, j): im2col's column of that offset, whatever the stride and dilation",
        ),
        "dxp[:, :, i:i + ho, j:j + wo] += torch.einsum('nohw,oc->nchw', dout, weight[:, :, i, j])": (
            "dcols[:, :, i, j] = torch.einsum('nohw,oc->nchw', dout, weight[:, :, i, j])",
            "the same product, into that offset's column; the fold adds the overlapping windows up",
        ),
        "h, w = (dxp.shape[2] - 2 * p, dxp.shape[3] - 2 * p)": (
            "dx = F.fold(dcols, (h, w), (kh, kw), dilation, padding, stride)",
            "fold (col2im) adds each column back onto the pixels it was copied from, padding left out",
        ),
        "dx = dxp[:, :, p:p + h, p:p + w]": (
            "dx = F.fold(dcols, (h, w), (kh, kw), dilation, padding, stride)",
            "(the same fold)",
        ),
    },
    "maxpool2d": {
        "k, s = (kernel_size, stride)": ("n, c, h, w = batched", "the layer keeps the input's shape, not the window"),
        "n, c = dout.shape[:2]": ("n, c, h, w = batched", "(the same)"),
        "dx = torch.zeros(x_shape, dtype=dout.dtype)": (
            "dx = dout.new_zeros(n, c, h * w)",
            "each (n, c) plane flat: the argmaxes are flat indices into it",
        ),
        "winner = torch.nn.functional.one_hot(arg[:, :, i, j], k * k).to(dout.dtype)": (
            "dx.scatter_add_(2, idx, dout.reshape(idx.shape))",
            "every window at once: its dout added where its winner sits (torch's flat argmax, padding and dilation "
            "included), overlapping windows adding up",
        ),
        "dx[:, :, i * s:i * s + k, j * s:j * s + k] += (winner * dout[:, :, i, j, None]).view(n, c, k, k)": (
            "dx.scatter_add_(2, idx, dout.reshape(idx.shape))",
            "(the same scatter)",
        ),
    },
}


class _Unprefixed(ast.NodeTransformer):
    """``self.x`` and ``saved.x`` -> ``x``."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "saved"):
            return ast.copy_location(ast.Name(id=node.attr, ctx=node.ctx), node)
        return node


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Every simple statement, those inside loops and branches included."""
    out = []
    for stmt in body:
        nested = [getattr(stmt, f) for f in ("body", "orelse") if isinstance(getattr(stmt, f, None), list)]
        if nested:
            for block in nested:
                out += _statements(block)
        else:
            out.append(stmt)
    return out


def _normal(stmt: ast.AST) -> str:
    return ast.unparse(_Unprefixed().visit(stmt))


def _accumulates(stmt: ast.stmt) -> bool:
    """The solution's ``p.grad = ...`` / ``p.grad += ...`` (what the template does for every layer)."""
    return any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(stmt))


def solution_statements(name: str) -> list[str]:
    """The normalised statements of the exercise solution's backward, less the accumulation and the return."""
    module = importlib.import_module(f"learn.exercises.{name}")
    tree = ast.parse(inspect.getsource(module))
    backward = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "backward")
    body = [s for s in backward.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return [_normal(s) for s in _statements(body) if not isinstance(s, ast.Return) and not _accumulates(s)]


def layer_statements(name: str) -> set[str]:
    """The normalised statements of the layer's textbook backward."""
    out = set()
    for fn in LAYERS[name]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        for stmt in _statements(tree.body[0].body):
            out.add(_normal(stmt))
    return out


@pytest.mark.parametrize("name", list(LAYERS))
def test_the_solution_s_formula_statements_appear_in_the_layer_s_backward(name):
    wanted = solution_statements(name)
    assert wanted, f"no statement found in the solution of {name}"
    have = layer_statements(name)
    otherwise = {ast.unparse(ast.parse(k)): v for k, v in OTHERWISE.get(name, {}).items()}
    missing = []
    for stmt in wanted:
        if stmt in otherwise:
            stand_in = ast.unparse(_Unprefixed().visit(ast.parse(otherwise[stmt][0])))
            assert stand_in in have, f"{name}: OTHERWISE names {stand_in!r}, which the layer no longer writes"
        elif stmt not in have:
            missing.append(stmt)
    assert not missing, (
        f"{name}: the solution's statements missing from the layer's backward "
        f"({', '.join(f.__qualname__ for f in LAYERS[name])}):\n  " + "\n  ".join(missing)
    )
    stale = set(otherwise) - set(wanted)
    assert not stale, f"{name}: OTHERWISE names statements the solution no longer has: {sorted(stale)}"


@pytest.mark.parametrize("textbook", [True, False], ids=["textbook", "kernels"])
def test_the_conv2d_solution_and_the_layer_compute_the_same_gradients(textbook):
    from learn.exercises.conv2d import Conv2d as Solution

    torch.manual_seed(0)
    sol = Solution(3, 4, 3, padding=1)
    ours = Conv2d(3, 4, 3, padding=1, dtype=F64)
    ours.load_state_dict({"weight": sol.weight, "bias": sol.bias})
    x = torch.randn(2, 3, 6, 5, dtype=F64)
    dout = torch.randn(2, 4, 6, 5, dtype=F64)
    with kernels.disabled() if textbook else torch.no_grad():
        out, dx = ours(x), ours.backward(dout)
    assert torch.allclose(out, sol.forward(x), rtol=1e-12, atol=1e-12)
    assert torch.allclose(dx, sol.backward(dout), rtol=1e-12, atol=1e-12)
    assert torch.allclose(ours.weight.grad, sol.weight.grad, rtol=1e-12, atol=1e-12)
    assert torch.allclose(ours.bias.grad, sol.bias.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("textbook", [True, False], ids=["textbook", "kernels"])
@pytest.mark.parametrize("kernel_size,stride", [(2, None), (3, 2), (3, 1)])
def test_the_maxpool2d_solution_and_the_layer_compute_the_same_gradients(kernel_size, stride, textbook):
    from learn.exercises.maxpool2d import MaxPool2d as Solution

    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8, dtype=F64)
    sol, ours = Solution(kernel_size, stride), MaxPool2d(kernel_size, stride)
    with kernels.disabled() if textbook else torch.no_grad():
        out = ours(x)
        dout = torch.randn_like(out)
        dx = ours.backward(dout)
    assert torch.equal(out, sol.forward(x)) and torch.allclose(dx, sol.backward(dout), rtol=1e-12, atol=1e-12)


def test_docs_layers_shows_linear_s_backward_and_the_solution_s_as_they_are():
    """docs/layers.md quotes Linear's backward_math and the exercise solution's backward: the quotes are the code."""
    import re
    from pathlib import Path

    from learn.exercises import linear as solution

    text = (Path(__file__).resolve().parents[1] / "docs" / "layers.md").read_text()
    section = text.split("## The layer is the textbook", 1)[1].split("\n## ", 1)[0]
    ours, theirs = re.findall(r"^```text\n(.*?)^```", section, re.S | re.M)[:2]
    assert ours == inspect.getsource(Linear.backward_math)
    quoted = ast.parse("class Solution:\n" + theirs).body[0].body[0]  # (indented as in the class: its docstring too)
    actual = next(
        n
        for n in ast.walk(ast.parse(inspect.getsource(solution)))
        if isinstance(n, ast.FunctionDef) and n.name == "backward"
    )
    assert ast.dump(quoted) == ast.dump(actual)
