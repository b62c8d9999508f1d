"""Exercise moe_dispatch: a mixture of experts' dispatch and combine, forward and backward, the experts Linear maps.

Shapes (N = tokens, C = in_features, O = out_features, K = experts, k = the experts a token is sent to, M = the
tokens one expert takes):
    x (N, C), gates (N, k), experts (N, k) -> out (N, O); weight (K, O, C), expert e's Linear (no bias)
The router (layers/moe.py: softmax, top-k) has chosen: token n goes to experts[n, j] (k distinct experts) with
gate gates[n, j].  An expert takes at most `capacity` tokens; keep() (given) says which assignments fit, first
choices first, each in token order; the rest are dropped and add nothing.
    dispatch: expert e gathers its kept tokens x_e = x[tokens_e] (M, C)
    expert:   y_e = x_e W_e^T (M, O)
    combine:  out[n] = sum_j kept[n, j] gates[n, j] y_{experts[n, j]}[n]   (a gate-weighted sum over its experts)
backward returns (dx, dgates) and adds dweight into weight.grad.  The combine is a product: its backward sends
dout to the expert outputs scaled by the gate, and to the gate dotted with the expert's output.  The dispatch is a
gather: its backward is a scatter-add, and a token sent to k experts receives k gradients.  The experts' choice
and the capacity are piecewise constant: no gradient flows into them.
{check}
"""
import torch


def keep(experts, n_experts, capacity):
    """experts (N, k) -> kept (N, k) bool: each expert's first `capacity` assignments in priority order, all first
    choices in token order, then all second choices, ... (GShard's, layers/moe.py's route())."""
    order = experts.T.reshape(-1)  # (k N,) choice-major: the queue's order
    queue = torch.nn.functional.one_hot(order, n_experts).cumsum(0)  # (k N, K) the running count per expert
    place = queue.gather(1, order[:, None]).squeeze(1) - 1  # (k N,) each assignment's place in its expert's queue
    return (place < capacity).view(experts.shape[1], -1).T


class MoEDispatchCombine:
    def __init__(self, n_experts, in_features, out_features, capacity):
        self.n_experts, self.capacity = n_experts, capacity
        bound = in_features ** -0.5  # nn.Linear's initialisation, one (O, C) matrix per expert
        self.weight = (2 * torch.rand(n_experts, out_features, in_features, dtype=torch.float64) - 1) * bound

    def parameters(self):
        return [self.weight]

    def forward(self, x, gates, experts):
        """x (N, C), gates (N, k), experts (N, k) int -> out (N, O)."""
        # TODO: kept = keep(...); for each expert e, its kept assignments (tokens, slots) with tokens its rows of
        #       x and slots the column of experts (and gates) that sent them; dispatch, y_e, and combine: add
        #       gates[tokens, slots] * y_e into those rows of out (N, O).  Keep what backward needs.
        ### BEGIN SOLUTION
        kept = keep(experts, self.n_experts, self.capacity)  # (N, k)
        out = torch.zeros(x.shape[0], self.weight.shape[1], dtype=x.dtype)  # (N, O)
        self.routes = []
        for e in range(self.n_experts):
            tokens, slots = ((experts == e) & kept).nonzero(as_tuple=True)  # (M,) each
            y = x[tokens] @ self.weight[e].T  # (M, O): dispatch, then the expert
            out.index_add_(0, tokens, gates[tokens, slots, None] * y)  # combine
            self.routes.append((tokens, slots, y))
        self.x, self.gates = x, gates
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout (N, O) -> (dx (N, C), dgates (N, k)); dweight (K, O, C) added into weight.grad."""
        # TODO: for each expert: the gates' gradient (a dot product per kept assignment; a dropped one gets 0);
        #       dy_e (M, O), the expert output's gradient; dW_e (O, C); and dx_e (M, C) scattered back to its
        #       tokens, added up over a token's experts.
        ### BEGIN SOLUTION
        dx, dgates = torch.zeros_like(self.x), torch.zeros_like(self.gates)  # (N, C), (N, k)
        dweight = torch.zeros_like(self.weight)  # (K, O, C)
        for e, (tokens, slots, y) in enumerate(self.routes):
            dgates[tokens, slots] = (dout[tokens] * y).sum(-1)  # (M,): the gate scales y
            dy = self.gates[tokens, slots, None] * dout[tokens]  # (M, O): y is scaled by its gate
            dweight[e] = dy.T @ self.x[tokens]  # (O, C)
            dx.index_add_(0, tokens, dy @ self.weight[e])  # the dispatch's backward: a scatter-add
        if self.weight.grad is None:
            self.weight.grad = torch.zeros_like(self.weight)
        self.weight.grad += dweight
        ### END SOLUTION
        return dx, dgates
