"""Backpropagation through time arranged for speed (``bptt.py``), as torch.compile traces it (``graph.py``), and the
products both make (``matmul.py``): the recurrent layers' kernels, behind the cells' per-step equations
(layers/recurrent/cells.py) that the sequence layers' textbook loops over."""

from . import bptt, graph, matmul  # noqa: F401
