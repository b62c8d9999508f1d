"""The forms a kernel gives a parameter gradient in, left to the template to add into ``.grad`` without a temporary.

A textbook backward returns each parameter gradient as a tensor (``dweight = dout.T @ x``), which the template adds
into ``.grad`` (layers/template.py).  A kernel may return it unevaluated instead:

    Product(a, b)          dW = a @ b, computed only for a parameter that requires a gradient: it becomes ``.grad``
                           on first use and is added in place with ``addmm_`` after (no (H, D) temporary)
    IndexAdd(index, rows)  row ``index[i]`` of dW receives ``rows[i]``, repeated indices adding up: scattered with
                           ``index_add_`` straight into ``.grad`` (no temporary of the table's size)
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class Product(NamedTuple):
    """A parameter gradient ``a @ b`` (a weight gradient is one GEMM: ``dW = dout^T x``), left to the base to
    compute: skipped for a frozen parameter, written as ``.grad`` on first use, added in place (``addmm_``, no
    temporary) when ``.grad`` exists."""

    a: Tensor
    b: Tensor


class IndexAdd(NamedTuple):
    """A parameter gradient whose row ``index[i]`` receives ``source[i]``, repeated indices adding up (an embedding's
    scatter-add), left to the base: skipped for a frozen parameter, added with ``index_add_`` into ``.grad`` in
    place (zeros on first use): no temporary of the table's size."""

    index: Tensor  # type: ignore[assignment]  # (P,) row of each source row (tuple's index() is not used)
    source: Tensor  # (P, D)
