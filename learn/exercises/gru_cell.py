"""Exercise gru_cell: write the backward of GRUCell, one step of a GRU (nn.GRUCell's).

Shapes (N = batch, I = input_size, H = hidden_size): x (N, I), h (N, H) -> h_next (N, H).
weight_ih (3H, I), weight_hh (3H, H), bias_ih and bias_hh (3H,): the gates stacked r, z, n, as PyTorch does.

    r = sigmoid(x W_ir^T + b_ir + h W_hr^T + b_hr)       the reset gate
    z = sigmoid(x W_iz^T + b_iz + h W_hz^T + b_hz)       the update gate
    n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn))    the candidate: r multiplies W_hn h + b_hn, inside
    h_next = (1 - z) * n + z * h
h reaches h_next three ways: directly (through z * h), through the gates, and through n.
{check}
"""
import torch


class GRUCell:
    def __init__(self, input_size, hidden_size):
        bound = hidden_size ** -0.5  # nn.GRUCell's initialisation: uniform in [-bound, bound]

        def uniform(*shape):
            return (2 * torch.rand(*shape, dtype=torch.float64) - 1) * bound
        self.weight_ih = uniform(3 * hidden_size, input_size)  # (3H, I)
        self.weight_hh = uniform(3 * hidden_size, hidden_size)  # (3H, H)
        self.bias_ih = uniform(3 * hidden_size)  # (3H,)
        self.bias_hh = uniform(3 * hidden_size)  # (3H,)

    def parameters(self):
        return [self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh]

    def forward(self, x, h):
        """x (N, I), h (N, H) -> h_next (N, H).  Given."""
        gi = x @ self.weight_ih.T + self.bias_ih  # (N, 3H)
        gh = h @ self.weight_hh.T + self.bias_hh  # (N, 3H)
        i_r, i_z, i_n = gi.chunk(3, dim=1)  # (N, H) each, in PyTorch's order r, z, n
        h_r, h_z, h_n = gh.chunk(3, dim=1)
        r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)  # (N, H) each
        n = torch.tanh(i_n + r * h_n)  # (N, H)
        h_next = (1 - z) * n + z * h  # (N, H)
        self.cache = (x, h, r, z, n, h_n)
        return h_next

    def backward(self, dh_next):
        """dh_next (N, H) -> (dx (N, I), dh (N, H)); adds the gradients of weight_ih (3H, I), weight_hh (3H, H),
        bias_ih and bias_hh (3H,) into their .grad."""
        # TODO: 1. through h_next = (1 - z) * n + z * h: dn, dz, and h's direct share (N, H);
        #       2. through n = tanh(a_n), a_n = i_n + r * h_n: da_n; then dr and dh_n (h_n is inside the product);
        #       3. through the sigmoids: da_r, da_z;
        #       4. dgi = [da_r, da_z, da_n] and dgh = [da_r, da_z, dh_n] (N, 3H), stacked r, z, n: the
        #          parameters' gradients, dx, and dh (its direct share plus dgh @ weight_hh).  Add into .grad.
        ### BEGIN SOLUTION
        x, h, r, z, n, h_n = self.cache
        dn, dz = dh_next * (1 - z), dh_next * (h - n)  # (N, H) each
        da_n = dn * (1 - n ** 2)  # the candidate's pre-activation
        dr, dh_n = da_n * h_n, da_n * r  # r multiplies h_n inside the tanh
        da_r, da_z = dr * r * (1 - r), dz * z * (1 - z)
        dgi = torch.cat([da_r, da_z, da_n], dim=1)  # (N, 3H)
        dgh = torch.cat([da_r, da_z, dh_n], dim=1)  # (N, 3H)
        dx = dgi @ self.weight_ih  # (N, I)
        dh = dh_next * z + dgh @ self.weight_hh  # (N, H): directly, and through the gates and n
        grads = ((self.weight_ih, dgi.T @ x), (self.weight_hh, dgh.T @ h),  # (3H, I), (3H, H)
                 (self.bias_ih, dgi.sum(0)), (self.bias_hh, dgh.sum(0)))  # (3H,) each
        for p, gp in grads:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad += gp
        ### END SOLUTION
        return dx, dh
