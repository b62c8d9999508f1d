"""autodiff.draw_graph: the DOT text of a small graph, node by node and edge by edge; rendering where `dot` exists.

(examples/xor.py --draw is exercised by tests/test_autodiff.py's one run of the example.)
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from autodiff import Tensor, draw_graph
from autodiff.draw import to_dot

HAS_DOT = shutil.which("dot") is not None


def _small():
    """loss = sum(tanh(x @ w + b)): x data (1, 2), w (2, 2) and b (2,) parameters; backward kept for drawing."""
    x = Tensor(torch.tensor([[1.0, -2.0]], dtype=torch.float64))
    w = Tensor(torch.tensor([[0.5, -1.0], [0.25, 2.0]], dtype=torch.float64), requires_grad=True)
    b = Tensor(torch.tensor([0.1, 0.2], dtype=torch.float64), requires_grad=True)
    loss = (x @ w + b).tanh().sum()
    loss.backward(retain_graph=True)
    return x, w, b, loss


def _parse(text: str):
    nodes = {k: v for k, v in re.findall(r"^  (\w+) \[(.*)\];$", text, flags=re.M) if k != "node"}
    edges = set(re.findall(r"^  (\w+) -> (\w+);$", text, flags=re.M))
    return nodes, edges


def test_dot_text_structure():
    x, w, b, loss = _small()
    text = draw_graph(loss, labels={"x": x, "w": w, "b": b})
    assert text.startswith("digraph autodiff {\n  rankdir=LR;") and text.endswith("}\n")
    nodes, edges = _parse(text)
    # 7 tensors (x, w, b, x@w, +b, tanh, sum), numbered parents first, and one oval per op.
    tensors = {k: v for k, v in nodes.items() if not k.endswith("_op")}
    ops = {k: re.search(r'label="(\w+)"', v).group(1) for k, v in nodes.items() if k.endswith("_op")}
    assert len(tensors) == 7 and sorted(ops.values()) == ["add", "matmul", "sum", "tanh"]
    by_title = {re.search(r'label="([^|"]*) \|', v).group(1): k for k, v in tensors.items()}
    assert set(by_title) == {"x", "w", "b", "matmul", "add", "tanh", "sum"}
    t = by_title
    assert edges == {
        (t["x"], t["matmul"] + "_op"),
        (t["w"], t["matmul"] + "_op"),
        (t["matmul"] + "_op", t["matmul"]),
        (t["matmul"], t["add"] + "_op"),
        (t["b"], t["add"] + "_op"),
        (t["add"] + "_op", t["add"]),
        (t["add"], t["tanh"] + "_op"),
        (t["tanh"] + "_op", t["tanh"]),
        (t["tanh"], t["sum"] + "_op"),
        (t["sum"] + "_op", t["sum"]),
    }
    # Shapes, data and gradients of small tensors; the data input is dashed and has no grad field.
    assert 'label="x | (1, 2) float64 | data [1 -2]", style=dashed' in nodes[t["x"]]
    assert "(2, 2) float64 | data [0.5 -1; 0.25 2] | grad " in nodes[t["w"]]
    h = torch.tensor([[1.0, -2.0]], dtype=torch.float64) @ w.data + b.data  # (1, 2)
    gb = 1 - torch.tanh(h) ** 2  # d loss / d b
    assert f"grad [{gb[0, 0].item():.4g} {gb[0, 1].item():.4g}]" in nodes[t["b"]]
    assert f'data {torch.tanh(h).sum().item():.4g} | grad 1"' in nodes[t["sum"]]
    assert "style=dashed" not in nodes[t["w"]]


def test_large_tensors_show_mean_and_std_and_labels_escape():
    a = Tensor(torch.arange(12.0).reshape(3, 4), requires_grad=True)
    text = to_dot((a * 2.0).sum(), labels=[("a<1>|{x}", a)], max_elements=4)
    assert "a\\<1\\>\\|\\{x\\}" in text  # record-label specials escaped
    assert f"data mean 5.5, std {torch.arange(12.0).std().item():.4g}" in text
    assert "grad None" in text  # no backward yet
    assert text.count("->") == 5  # a -> mul_op, const -> mul_op, mul_op -> mul, mul -> sum_op, sum_op -> sum


def test_errors():
    x, w, b, loss = _small()
    with pytest.raises(ValueError, match="format must be one of svg, png, pdf, dot, got 'jpeg'"):
        draw_graph(loss, "g.jpeg", format="jpeg")
    with pytest.raises(TypeError, match="expected an autodiff Tensor, got Tensor"):
        draw_graph(torch.zeros(2))
    with pytest.raises(TypeError, match="label 'w' names a Tensor, not an autodiff Tensor"):
        draw_graph(loss, labels={"w": w.data})
    loss.backward()  # frees the graph
    with pytest.raises(RuntimeError, match="freed by backward"):
        draw_graph(loss)


def test_missing_dot_says_how_to_install(monkeypatch, tmp_path):
    _, _, _, loss = _small()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"apt-get install graphviz"):
        draw_graph(loss, tmp_path / "g.svg")
    assert not (tmp_path / "g.svg").exists()
    text = draw_graph(loss, tmp_path / "g.dot", format="dot")  # the DOT text needs no Graphviz
    assert (tmp_path / "g.dot").read_text() == text


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz's dot is not installed")
@pytest.mark.parametrize("fmt,magic", [("svg", b"<svg"), ("png", b"\x89PNG")])
def test_renders_with_dot(tmp_path, fmt, magic):
    _, _, _, loss = _small()
    out = tmp_path / f"g.{fmt}"
    draw_graph(loss, out, format=fmt)
    assert magic in out.read_bytes()[:400]
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary left behind
