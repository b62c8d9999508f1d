"""The twin of ``tp_gpt``: the nn.Module GPT split by torch's own tensor parallelism (DTensor's
``ColwiseParallel``/``RowwiseParallel`` through ``parallelize_module``), autograd doing every backward.

torch shards a column-parallel Linear's weight in contiguous row blocks, while nanoGPT packs q, k and v in one
(3C, C) matrix: block r of it would hold q's heads and some of k's.  So the rows of ``c_attn`` are first put in
rank-major order (rank 0's heads of q, k, v, then rank 1's, ...), and each attention module is given a forward
that splits its local output in three and runs its nh/P heads (as torchtitan sets its modules' local head counts).
The embeddings, the layer norms and the tied output layer stay replicated in the twin: the hand-written side's
vocabulary-parallel embedding and loss are checked against one process instead.  ``full_state_dict`` gathers the
twin's weights (``DTensor.full_tensor``) back into the one-process layout.
"""

from __future__ import annotations

import math
import types
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def _rank_major(C: int, size: int) -> Tensor:
    """Row order of the packed (3C, C) q/k/v matrix that puts each rank's q, k, v rows in one contiguous block."""
    per = C // size
    return torch.cat([torch.arange(r * per, (r + 1) * per) + j * C for r in range(size) for j in range(3)])


def _local_attention_forward(self, x: Tensor) -> Tensor:
    """nanoGPT's attention on this rank's heads: its third of c_attn's local output each for q, k and v."""
    B, T, _ = x.shape
    q, k, v = self.c_attn(x).split(self.local_embd, dim=2)  # (B, T, C/P) each
    q, k, v = (t.view(B, T, self.local_heads, self.head_size).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.head_size))
    return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, self.local_embd)))


def tensor_parallel_twin(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """Split a ``models.PytorchGPT`` (dropout 0) over the 1-D ``mesh`` in place; returns it."""
    size = mesh.size()
    gpt: Any = model  # nanoGPT's PytorchGPT: its config() and its ModuleDict's entries, read by attribute
    cfg = gpt.config()
    C, nh = cfg["n_embd"], cfg["n_head"]
    if cfg["dropout"]:
        raise ValueError("tensor parallelism: the twin runs with dropout 0")
    order = _rank_major(C, size)
    for block in gpt.transformer.h:
        attn = block.attn
        with torch.no_grad():
            attn.c_attn.weight.copy_(attn.c_attn.weight[order])
            if attn.c_attn.bias is not None:
                attn.c_attn.bias.copy_(attn.c_attn.bias[order])
        parallelize_module(
            block,
            mesh,
            {
                "attn.c_attn": ColwiseParallel(),
                "attn.c_proj": RowwiseParallel(),
                "mlp.c_fc": ColwiseParallel(),
                "mlp.c_proj": RowwiseParallel(),
            },
        )
        attn.local_embd, attn.local_heads, attn.head_size = C // size, nh // size, C // nh
        attn.forward = types.MethodType(_local_attention_forward, attn)
    return model


def full_state_dict(model: torch.nn.Module, size: int) -> dict[str, Tensor]:
    """The twin's parameters whole, in the one-process layout (collective: every rank calls it)."""
    gpt: Any = model  # nanoGPT's PytorchGPT (its config())
    C = gpt.config()["n_embd"]
    inverse = torch.argsort(_rank_major(C, size))
    out = {}
    for name, p in model.named_parameters():
        t = cast(DTensor, p.detach()).full_tensor() if isinstance(p, DTensor) else p.detach()  # detach keeps a DTensor
        out[name] = t[inverse] if name.endswith("attn.c_attn.weight") or name.endswith("attn.c_attn.bias") else t
    return out
