"""``draw_graph``: the engine's computation graph as Graphviz DOT text, rendered with ``dot`` when it is installed.

micrograd's ``draw_dot`` for tensors instead of scalars: one box per tensor (its name or op, shape and
dtype, and for a small tensor its data and grad), one oval per operation, arrows in the direction of the
forward pass.  Solid boxes are the nodes ``backward()`` walks (they require grad); dashed boxes are
inputs that do not (data, constants), drawn for context.  Draw before ``backward()``, or after
``backward(retain_graph=True)`` to see every gradient: a plain ``backward()`` frees the graph.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from layers.checks import check_int

from .engine import Tensor, _topological_order

FORMATS = ("svg", "png", "pdf", "dot")
INSTALL_HINT = (
    "Graphviz's `dot` program is not installed, so the graph cannot be rendered to {fmt}. Install it "
    "(Debian/Ubuntu: `sudo apt-get install graphviz`; macOS: `brew install graphviz`; conda: "
    "`conda install graphviz`), or {dot} to write the DOT text, which any Graphviz viewer renders."
)


def _escape(text: str) -> str:
    """Text safe inside a DOT record label (its field separators and quotes escaped)."""
    for ch in '\\{}|<>"':
        text = text.replace(ch, "\\" + ch)
    return text


def _values(t: torch.Tensor | None, max_elements: int) -> str:
    if t is None:
        return "None"
    if t.numel() <= max_elements:
        if t.dim() == 0:
            return f"{t.item():.4g}"
        rows = t.detach().cpu().reshape(-1, t.shape[-1]) if t.dim() > 1 else t.detach().cpu().reshape(1, -1)
        text = "; ".join(" ".join(f"{v:.4g}" for v in row.tolist()) for row in rows)
        return f"[{text}]"
    x = t.detach().double()
    return f"mean {x.mean().item():.4g}, std {x.std().item():.4g}" if t.numel() > 1 else f"{x.item():.4g}"


def to_dot(
    root: Tensor,
    labels: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]] | None = None,
    max_elements: int = 8,
    rankdir: str = "LR",
) -> str:
    """The graph behind ``root`` as Graphviz DOT text (see ``draw_graph``)."""
    if not isinstance(root, Tensor):
        raise TypeError(f"draw_graph: expected an autodiff Tensor, got {type(root).__name__}")
    if root._released:
        raise RuntimeError(
            "draw_graph: this graph was freed by backward(); draw it before backward(), or call "
            "backward(retain_graph=True) to draw it with its gradients"
        )
    check_int("draw_graph", "max_elements", max_elements, lo=0)
    if rankdir not in ("LR", "TB", "RL", "BT"):
        raise ValueError(f"draw_graph: rankdir must be one of LR, TB, RL, BT, got {rankdir!r}")
    pairs = labels.items() if isinstance(labels, Mapping) else (labels or ())
    name_of = {}
    for name, t in pairs:
        if not isinstance(t, Tensor):
            raise TypeError(f"draw_graph: label '{name}' names a {type(t).__name__}, not an autodiff Tensor")
        name_of[id(t)] = name
    nodes = _topological_order(root, every_node=True)
    ids = {id(node): f"t{i}" for i, node in enumerate(nodes)}
    lines = ["digraph autodiff {", f"  rankdir={rankdir};", '  node [fontname="Helvetica", fontsize=10];']
    for node in nodes:
        tid = ids[id(node)]
        title = name_of.get(id(node)) or (node._op if node._op else ("leaf" if node.requires_grad else "input"))
        dtype = str(node.dtype).replace("torch.", "")
        fields = [title, f"{tuple(node.shape)} {dtype}", f"data {_values(node.data, max_elements)}"]
        if node.requires_grad:
            fields.append(f"grad {_values(node.grad, max_elements)}")
        label = " | ".join(_escape(f) for f in fields)  # stacked top to bottom when rankdir is LR
        style = "" if node.requires_grad else ", style=dashed, color=gray40, fontcolor=gray25"
        lines.append(f'  {tid} [shape=record, label="{label}"{style}];')
        if node._op:
            lines.append(f'  {tid}_op [shape=ellipse, label="{_escape(node._op)}"];')
            lines.append(f"  {tid}_op -> {tid};")
            for parent in node._prev:
                lines.append(f"  {ids[id(parent)]} -> {tid}_op;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw_graph(
    tensor: Tensor,
    path: str | os.PathLike | None = None,
    format: str = "svg",
    *,
    labels: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]] | None = None,
    max_elements: int = 8,
    rankdir: str = "LR",
) -> str:
    """The computation graph ``tensor.backward()`` would walk, as Graphviz DOT text (returned).

    tensor:        an autodiff Tensor (usually the loss), before backward() or after backward(retain_graph=True).
    path, format:  also write the graph to ``path``: rendered by Graphviz's ``dot`` as "svg", "png" or "pdf"
                   (a RuntimeError saying how to install Graphviz if ``dot`` is missing), or "dot" for the
                   DOT text itself (no Graphviz needed).  The file is written atomically.
    labels:        names for tensors, e.g. ``dict(model.named_parameters())`` (else a leaf is "leaf", an
                   input that needs no gradient "input", any other node its op).
    max_elements:  tensors with at most this many elements show their values; larger ones their mean and std.
    rankdir:       "LR" (left to right, as micrograd draws) or "TB", "RL", "BT".
    """
    if format not in FORMATS:
        raise ValueError(f"draw_graph: format must be one of {', '.join(FORMATS)}, got {format!r}")
    text = to_dot(tensor, labels, max_elements, rankdir)
    if path is None:
        return text
    path = Path(path)
    if format != "dot" and shutil.which("dot") is None:
        raise RuntimeError(INSTALL_HINT.format(fmt=format, dot="pass format='dot'"))
    tmp = str(path.with_name(f".{path.name}.{os.getpid()}.tmp"))  # beside the target: os.replace is atomic
    try:
        if format == "dot":
            Path(tmp).write_text(text)
        else:
            r = subprocess.run(
                [shutil.which("dot") or "dot", f"-T{format}", "-o", tmp],
                input=text,
                text=True,
                capture_output=True,
                timeout=120,
            )
            if r.returncode != 0:
                raise RuntimeError(f"draw_graph: `dot -T{format}` failed (exit {r.returncode}): {r.stderr.strip()}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return text
