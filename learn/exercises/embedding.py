"""Exercise embedding: write Embedding, a table lookup (nn.Embedding's).

Shapes (V = num_embeddings, D = embedding_dim, N = batch size, T = positions):
    weight (V, D), one row per id;  idx (N, T) int64 ids in [0, V) -> out (N, T, D), out[n, t] = weight[idx[n, t]]
backward(dout) takes dout (N, T, D), adds dL/dweight (V, D) into weight.grad and returns None: the ids
are integers, they have no gradient.  An id that appears several times in idx was looked up several
times, and its row receives the sum of their gradients.
{check}
"""
import torch


class Embedding:
    def __init__(self, num_embeddings, embedding_dim):
        self.weight = torch.randn(num_embeddings, embedding_dim, dtype=torch.float64)  # (V, D), as nn.Embedding

    def parameters(self):
        return [self.weight]

    def forward(self, idx):
        """idx (N, T) int64 -> out (N, T, D)."""
        # TODO: look the rows up; keep idx for backward.
        ### BEGIN SOLUTION
        self.idx = idx  # (N, T)
        out = self.weight[idx]  # (N, T, D)
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout (N, T, D) -> None; adds dweight (V, D) into weight.grad."""
        # TODO: dweight (V, D): row v is the sum of dout[n, t] over every position where idx[n, t] == v.
        #       Add it into self.weight.grad (create .grad when None).
        ### BEGIN SOLUTION
        dweight = torch.zeros_like(self.weight)  # (V, D)
        dweight.index_add_(0, self.idx.reshape(-1), dout.reshape(-1, dout.shape[-1]))  # repeated ids add up
        if self.weight.grad is None:
            self.weight.grad = torch.zeros_like(self.weight)
        self.weight.grad += dweight
        ### END SOLUTION
        return None
