"""Exercise attention: write CausalAttention, scaled dot-product attention with a causal mask
(F.scaled_dot_product_attention(q, k, v, is_causal=True)'s).

Shapes (N = batch size, T = sequence length, d = head size):
    q, k, v (N, T, d) -> out (N, T, d)
    scores = q k^T / sqrt(d) (N, T, T); the future masked: a query t sees the keys s <= t only
    att = softmax of each row of scores (N, T, T); out = att v
Attention is the one layer here that mixes positions: out[t] draws on v[s] for every s <= t.  backward
returns (dq, dk, dv).  Each probability of a row depends on every score of that row (softmax's Jacobian),
and the 1/sqrt(d) scale of the forward is part of the backward too.
{check}
"""
import torch


class CausalAttention:
    def forward(self, q, k, v):
        """q, k, v (N, T, d) -> out (N, T, d)."""
        # TODO: scores (N, T, T) = q k^T / sqrt(d); set the future (key s > query t) to -inf so that softmax
        #       gives it 0; att = softmax over the keys (the last axis); out = att v.  Keep what backward needs.
        ### BEGIN SOLUTION
        t, d = q.shape[1], q.shape[2]
        self.scale = d ** -0.5
        scores = q @ k.transpose(1, 2) * self.scale  # (N, T, T)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)  # (T, T): True where key s > query t
        att = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)  # (N, T, T), 0 on the future
        out = att @ v  # (N, T, d)
        self.q, self.k, self.v, self.att = q, k, v, att
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout (N, T, d) -> (dq, dk, dv), each (N, T, d)."""
        # TODO: back through out = att v: datt (N, T, T) and dv (N, T, d); through the softmax, row by row, to
        #       dscores (N, T, T) (a masked score gets nothing: its att is 0); through scores = q k^T * scale
        #       to dq and dk (N, T, d).
        # (Optional: record intermediates as self.saved = {"name": tensor}, names among scores, att, dscores, datt;
        #  the check compares each with autograd's, exact or not.)
        ### BEGIN SOLUTION
        dv = self.att.transpose(1, 2) @ dout  # (N, T, d)
        datt = dout @ self.v.transpose(1, 2)  # (N, T, T)
        dscores = self.att * (datt - (datt * self.att).sum(-1, keepdim=True))  # softmax's Jacobian, per row
        dq = dscores @ self.k * self.scale  # (N, T, d)
        dk = dscores.transpose(1, 2) @ self.q * self.scale  # (N, T, d)
        ### END SOLUTION
        return dq, dk, dv
