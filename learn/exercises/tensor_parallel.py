"""Exercise tensor_parallel: split an MLP over T ranks as Megatron-LM does, with its f and g written by hand.

The one-process MLP (N = batch size, D = in_features, H = hidden_features, O = out_features):
    h = tanh(x @ weight1^T + bias1)      x (N, D), weight1 (H, D), bias1 (H,), h (N, H)
    out = h @ weight2^T + bias2          weight2 (O, H), bias2 (O,), out (N, O)
Split over T ranks (H divides by T).  The ranks are simulated: a Python list holds one tensor per rank.
    column-parallel (the first Linear): rank r holds rows r*H/T..(r+1)*H/T of weight1 and of bias1 and
        computes its own slice of h, (N, H/T); tanh works on each slice alone, with no communication
    row-parallel (the second Linear): rank r holds the same block of *columns* of weight2, (O, H/T), and
        multiplies its own slice of h: partial_r = h_r @ weight2_r^T (N, O); out = the sum over r, + bias2
Megatron's conjugate pair f and g carries all of the communication:
    f, before the column-parallel Linear: forward the identity (every rank holds the whole x already);
       backward an all-reduce, the sum over ranks: rank r's dx comes through its rows of weight1 only
    g, after the row-parallel product: forward an all-reduce (out is the sum of the partial products);
       backward the identity: every rank's partial product receives the whole of dout
The gradients go into the one-process parameters' .grad: rank r's shard gradient into its own rows (or
columns) of the full gradient, where gathering the ranks' shards would put it.
{check}
"""
import torch


def all_reduce(parts):
    """The one collective: [t_0, ..., t_{T-1}], one tensor per rank, all of one shape -> T copies of
    t_0 + ... + t_{T-1}, one for each rank (summed in rank order)."""
    total = parts[0].clone()
    for t in parts[1:]:
        total += t
    return [total.clone() for _ in parts]


def shard(t, dim, ranks):
    """t cut into `ranks` equal blocks along axis `dim`; element r is rank r's block.  Each block is a view, a
    window on t's memory (a real rank would hold a copy; here t stays the one-process tensor)."""
    if t.shape[dim] % ranks:
        raise ValueError(f"axis {dim} of a tensor of shape {tuple(t.shape)} does not divide among {ranks} ranks")
    return list(t.chunk(ranks, dim))


class CopyToTensorParallel:
    """f: identity forward, all-reduce backward.  Takes and returns lists, one tensor per rank."""

    def forward(self, xs):
        # TODO: what f's forward does to the ranks' inputs xs (each (N, D)).
        ### BEGIN SOLUTION
        return xs  # every rank holds the whole input already
        ### END SOLUTION

    def backward(self, dxs):
        # TODO: what f's backward does to the ranks' input gradients dxs (each (N, D), partial).
        ### BEGIN SOLUTION
        return all_reduce(dxs)  # dL/dx is the sum of what came back through each rank's rows
        ### END SOLUTION


class ReduceFromTensorParallel:
    """g: all-reduce forward, identity backward.  Takes and returns lists, one tensor per rank."""

    def forward(self, parts):
        # TODO: what g's forward does to the ranks' partial products (each (N, O)).
        ### BEGIN SOLUTION
        return all_reduce(parts)  # out is the sum of the partial products
        ### END SOLUTION

    def backward(self, douts):
        # TODO: what g's backward does to the ranks' douts (each (N, O), the same on every rank).
        ### BEGIN SOLUTION
        return douts  # each partial product is added into out once: it receives dout as it is
        ### END SOLUTION


class ColumnParallelLinear:
    """f, then rank r's rows of the Linear: xs, every rank's x (N, D) -> ys, rank r's slice of y (N, H/T)."""

    def __init__(self, weight, bias, ranks):
        self.weight, self.bias, self.ranks = weight, bias, ranks  # the one-process (H, D) and (H,)
        self.f = CopyToTensorParallel()
        # TODO: rank r's shards, with shard(): self.weights[r] (H/T, D) and self.biases[r] (H/T,).
        ### BEGIN SOLUTION
        self.weights = shard(weight, 0, ranks)  # rows: rank r computes outputs r*H/T.. of y
        self.biases = shard(bias, 0, ranks)
        ### END SOLUTION

    def forward(self, xs):
        # TODO: pass xs through f, keep what backward needs, return each rank's y_r = x_r @ W_r^T + b_r.
        ### BEGIN SOLUTION
        self.xs = self.f.forward(xs)
        return [x @ w.T + b for x, w, b in zip(self.xs, self.weights, self.biases)]  # (N, H/T) each
        ### END SOLUTION

    def backward(self, dys):
        """dys: rank r's dy_r (N, H/T) -> every rank's dx (N, D); rank r's shard gradients go into its rows of
        weight.grad and bias.grad (create each .grad as zeros when it is None, then +=)."""
        # TODO: each rank's dW_r (H/T, D), db_r (H/T,) into its rows of the .grad (shard() of a .grad gives
        #       views into it); each rank's partial dx_r (N, D); then through f's backward.
        ### BEGIN SOLUTION
        for p in (self.weight, self.bias):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for gw, gb, x, dy in zip(shard(self.weight.grad, 0, self.ranks), shard(self.bias.grad, 0, self.ranks),
                                 self.xs, dys):
            gw += dy.T @ x  # (H/T, D): rank r's rows of dweight
            gb += dy.sum(0)  # (H/T,)
        return self.f.backward([dy @ w for dy, w in zip(dys, self.weights)])  # partial (N, D) each, summed
        ### END SOLUTION


class RowParallelLinear:
    """Rank r's columns of the Linear, then g, then the bias: xs, rank r's x_r (N, H/T) -> every rank's out
    (N, O)."""

    def __init__(self, weight, bias, ranks):
        self.weight, self.bias, self.ranks = weight, bias, ranks  # the one-process (O, H) and (O,)
        self.g = ReduceFromTensorParallel()
        # TODO: rank r's shard, with shard(): self.weights[r] (O, H/T).  The bias is not split: one copy,
        #       the same on every rank.
        ### BEGIN SOLUTION
        self.weights = shard(weight, 1, ranks)  # columns: rank r multiplies its own slice of the input
        ### END SOLUTION

    def forward(self, xs):
        # TODO: each rank's partial product x_r @ W_r^T (N, O), through g, then the bias.
        ### BEGIN SOLUTION
        self.xs = xs
        outs = self.g.forward([x @ w.T for x, w in zip(xs, self.weights)])  # (N, O) on every rank
        return [out + self.bias for out in outs]  # once, after the sum: before it, T ranks would add it T times
        ### END SOLUTION

    def backward(self, douts):
        """douts: every rank's dout (N, O), the same on every rank -> rank r's dx_r (N, H/T); weight.grad gets rank
        r's (O, H/T) in its columns, bias.grad the bias's gradient once."""
        # TODO: 1. the bias's gradient (it was added after g, and once); 2. through g's backward;
        #       3. each rank's dW_r into its columns of weight.grad, and its dx_r.
        ### BEGIN SOLUTION
        for p in (self.weight, self.bias):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.bias.grad += douts[0].sum(0)  # one bias, one gradient: every rank has the same, add it once
        douts = self.g.backward(douts)
        for gw, x, dout in zip(shard(self.weight.grad, 1, self.ranks), self.xs, douts):
            gw += dout.T @ x  # (O, H/T): rank r's columns of dweight
        return [dout @ w for dout, w in zip(douts, self.weights)]  # (N, H/T) each
        ### END SOLUTION


class TensorParallelMLP:
    """The MLP of the docstring over `ranks` simulated ranks: column-parallel, tanh, row-parallel.  Given."""

    def __init__(self, in_features, hidden_features, out_features, ranks):
        def uniform(*shape, fan_in):  # nn.Linear's initialisation
            return (2 * torch.rand(*shape, dtype=torch.float64) - 1) * fan_in ** -0.5
        self.ranks = ranks
        self.weight1 = uniform(hidden_features, in_features, fan_in=in_features)  # (H, D)
        self.bias1 = uniform(hidden_features, fan_in=in_features)  # (H,)
        self.weight2 = uniform(out_features, hidden_features, fan_in=hidden_features)  # (O, H)
        self.bias2 = uniform(out_features, fan_in=hidden_features)  # (O,)
        self.fc1 = ColumnParallelLinear(self.weight1, self.bias1, ranks)
        self.fc2 = RowParallelLinear(self.weight2, self.bias2, ranks)

    def parameters(self):
        return [self.weight1, self.bias1, self.weight2, self.bias2]

    def forward(self, x):
        """x (N, D) -> out (N, O): every rank holds the same out after g; rank 0's is returned (the checker looks
        at every rank's, kept in self.outs)."""
        hs = self.fc1.forward([x for _ in range(self.ranks)])  # every rank holds the whole input
        self.hs = [torch.tanh(h) for h in hs]  # (N, H/T) each: element-wise, no communication
        self.outs = self.fc2.forward(self.hs)
        return self.outs[0]

    def backward(self, dout):
        """dout (N, O) -> dx (N, D); the four parameters' gradients added into their .grad."""
        dhs = self.fc2.backward([dout for _ in range(self.ranks)])  # the loss, and dout, are the same everywhere
        dhs = [dh * (1 - h ** 2) for dh, h in zip(dhs, self.hs)]  # tanh's backward, on each rank's slice
        self.dxs = self.fc1.backward(dhs)
        return self.dxs[0]  # every rank holds the same dx after f's backward (self.dxs)
