"""Exercise lstm_cell: write LSTMCell's backward (nn.LSTMCell's; the forward is given).

Shapes (N = batch size, I = input_size, H = hidden_size):
    x (N, I), state (h (N, H), c (N, H)) -> (h_next (N, H), c_next (N, H))
    weight_ih (4H, I), weight_hh (4H, H), bias_ih (4H,), bias_hh (4H,): the four gates stacked in
    PyTorch's order i, f, g, o (input, forget, cell, output)
    a = x weight_ih^T + bias_ih + h weight_hh^T + bias_hh (N, 4H), cut into ai, af, ag, ao (N, H)
    i, f, o = sigmoid(ai, af, ao); g = tanh(ag); c_next = f * c + i * g; h_next = o * tanh(c_next)
backward(dh_next, dc_next) gets the gradients of both outputs and returns (dx, dh, dc): the gradients of
x and of the state it was given.  c_next is used twice (it is returned, and it makes h_next), so its
gradient has two parts.
{check}
"""
import torch


class LSTMCell:
    def __init__(self, input_size, hidden_size):
        bound = hidden_size ** -0.5  # nn.LSTMCell's initialisation: uniform in [-bound, bound]

        def uniform(*shape):
            return (2 * torch.rand(*shape, dtype=torch.float64) - 1) * bound
        self.weight_ih = uniform(4 * hidden_size, input_size)  # (4H, I)
        self.weight_hh = uniform(4 * hidden_size, hidden_size)  # (4H, H)
        self.bias_ih = uniform(4 * hidden_size)  # (4H,)
        self.bias_hh = uniform(4 * hidden_size)  # (4H,)

    def parameters(self):
        return [self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh]

    def forward(self, x, state):
        """x (N, I), state = (h, c), each (N, H) -> (h_next, c_next), each (N, H).  Given."""
        h, c = state
        a = x @ self.weight_ih.T + self.bias_ih + h @ self.weight_hh.T + self.bias_hh  # (N, 4H)
        ai, af, ag, ao = a.chunk(4, dim=1)  # (N, H) each, in PyTorch's order i, f, g, o
        i, f, g, o = torch.sigmoid(ai), torch.sigmoid(af), torch.tanh(ag), torch.sigmoid(ao)
        c_next = f * c + i * g  # (N, H)
        tc = torch.tanh(c_next)  # (N, H)
        h_next = o * tc  # (N, H)
        self.cache = (x, h, c, i, f, g, o, tc)
        return h_next, c_next

    def backward(self, dh_next, dc_next):
        """dh_next, dc_next (N, H) -> (dx (N, I), dh (N, H), dc (N, H)); adds the gradients of weight_ih (4H, I),
        weight_hh (4H, H), bias_ih and bias_hh (4H,) into their .grad."""
        # TODO: 1. through h_next = o * tanh(c_next): do (N, H), and c_next's second share of gradient;
        #       2. through c_next = f * c + i * g: di, df, dg (N, H) and dc (N, H);
        #       3. through each gate's nonlinearity to da (N, 4H), stacked in the forward's order;
        #       4. through a: the four parameters' gradients, dx (N, I), dh (N, H).  Add into .grad.
        # (Optional: record intermediates as self.saved = {"name": tensor}, names among da, di, df, dg, do,
        #  dc_total, i, f, g, o, tc; the check compares each with autograd's, exact or not.)
        ### BEGIN SOLUTION
        x, h, c, i, f, g, o, tc = self.cache
        do = dh_next * tc  # (N, H)
        dc_total = dc_next + dh_next * o * (1 - tc ** 2)  # (N, H): c_next is returned and makes h_next
        di, df, dg = dc_total * g, dc_total * c, dc_total * i  # (N, H) each
        dc = dc_total * f  # (N, H): through the forget gate
        da = torch.cat([di * i * (1 - i), df * f * (1 - f), dg * (1 - g ** 2), do * o * (1 - o)], dim=1)  # (N, 4H)
        dx = da @ self.weight_ih  # (N, I)
        dh = da @ self.weight_hh  # (N, H)
        grads = ((self.weight_ih, da.T @ x), (self.weight_hh, da.T @ h),  # (4H, I), (4H, H)
                 (self.bias_ih, da.sum(0)), (self.bias_hh, da.sum(0)))  # both biases are added to a
        for p, gp in grads:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad += gp
        ### END SOLUTION
        return dx, dh, dc
