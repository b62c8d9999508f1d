"""Hints for each exercise, three levels: where to look, the idea, and nearly the answer (``python -m learn hint``)."""

HINTS = {
    "linear": [
        "Write out[n, h] = sum_d x[n, d] * weight[h, d] + bias[h] for one entry.  Each gradient is a sum over "
        "every output the tensor took part in.  Check the shapes: dx is (N, D), dweight is (H, D) like weight, "
        "dbias is (H,) like bias.",
        "dL/dx[n, d] = sum_h dout[n, h] * weight[h, d]: a matrix product of dout (N, H) with weight (H, D).  "
        "dL/dweight[h, d] = sum_n dout[n, h] * x[n, d]: a sum over the batch, dout transposed times x.  The bias "
        "is added to every row, so its gradient is dout summed over the batch.  No 1/N anywhere: the loss put it "
        "in dout already.",
        "In backward:\n"
        "    dx = dout @ self.weight\n    dweight = dout.T @ self.x\n    dbias = dout.sum(0)\n"
        "then for each parameter p and its gradient g:\n"
        "    if p.grad is None:\n        p.grad = torch.zeros_like(p)\n    p.grad += g",
    ],
    "relu": [
        "The forward is out = x where x > 0, else 0.  What is d out / d x in each of the two cases?",
        "The local derivative is 1 where x > 0 and 0 elsewhere: keep that mask from the forward (from x, not from "
        "dout) and multiply.  Make a new tensor: don't zero entries of dout in place.",
        "forward:\n    self.mask = x > 0\n    out = x * self.mask\nbackward:\n    dx = dout * self.mask",
    ],
    "sigmoid": [
        "Differentiate s = 1 / (1 + exp(-x)) and write the result with s itself.",
        "ds/dx = exp(-x) / (1 + exp(-x))**2 = s * (1 - s).  Keep s (the output) in the forward.",
        "forward:\n    self.out = torch.sigmoid(x)\nbackward:\n    s = self.out\n    dx = dout * s * (1 - s)",
    ],
    "tanh": [
        "Differentiate t = tanh(x) and write the result with t itself.",
        "d tanh(x)/dx = 1 - tanh(x)**2 = 1 - t**2, with t the output you keep from the forward (not the input).",
        "forward:\n    self.out = torch.tanh(x)\nbackward:\n    dx = dout * (1 - self.out ** 2)",
    ],
    "mse": [
        "The loss is (1 / M) * sum over all M = N * C elements of (input - target)**2.  Differentiate it with "
        "respect to one element of input.",
        "d/d input[i] of (input[i] - target[i])**2 is 2 (input[i] - target[i]), and the mean divides by M, the "
        "number of elements (input.numel()), not the number of rows.",
        "forward:\n    self.diff = input - target\n    loss = (self.diff ** 2).mean()\n"
        "backward:\n    dinput = 2 * self.diff / self.diff.numel()",
    ],
    "softmax_cross_entropy": [
        "For one row: loss = -log p[y] with p = softmax(z).  Use log p[y] = z[y] - log(sum_j exp(z_j)) and "
        "differentiate that with respect to each z_j.",
        "d(-log p[y]) / dz_j = p_j - 1[j == y]: the softmax minus the one-hot target.  The loss is the mean over "
        "the batch, so divide by N.  (Going through softmax's Jacobian by hand gives the same, provided you keep "
        "all of it, not just its diagonal.)",
        "forward:\n    shifted = logits - logits.max(1, keepdim=True).values\n"
        "    logp = shifted - shifted.exp().sum(1, keepdim=True).log()\n"
        "    self.p, self.target = logp.exp(), target\n    loss = -logp[torch.arange(len(target)), target].mean()\n"
        "backward:\n    dlogits = self.p.clone()\n    dlogits[torch.arange(n), self.target] -= 1\n"
        "    dlogits /= n",
    ],
    "value": [
        "Each _backward adds (local derivative) * out.grad into each input's .grad: for a + b the local "
        "derivatives are 1 and 1, for a * b they are b and a.  Use += (a node can be an input twice).",
        "tanh: 1 - t**2 with t the output; exp: the output e itself; x**n: n * x**(n - 1).  backward(): collect the "
        "nodes in topological order (a node after everything in its _prev), with a stack rather than recursion, "
        "then self.grad = 1.0 and call _backward on each node in *reversed* order.",
        "A topological order with an explicit stack, then the walk:\n"
        "    order, seen, stack = [], set(), [(self, False)]\n    while stack:\n"
        "        node, done = stack.pop()\n        if done:\n            order.append(node)\n"
        "        elif id(node) not in seen:\n            seen.add(id(node))\n"
        "            stack.append((node, True))\n            stack.extend((p, False) for p in node._prev)\n"
        "    self.grad = 1.0\n    for node in reversed(order):\n        node._backward()",
    ],
    "batchnorm": [
        "Do the easy ones first: out = weight * xhat + bias gives dbias = dout.sum(0), dweight = (dout * "
        "xhat).sum(0) and dxhat = dout * weight.  The hard part is dx: mean and var are functions of x too.",
        "Walk the forward backwards one step at a time (mean, x - mean, square, var, sqrt, 1/sqrt, xhat): x feeds "
        "xhat directly, through the mean, and through the variance.  Summing the three paths gives dx = rstd / N "
        "* (N * dxhat - (sum over the batch of dxhat) - xhat * (sum over the batch of dxhat * xhat)).",
        "With rstd = 1 / sqrt(var + eps) (the biased variance, divided by N) and xhat kept from the forward:\n"
        "    dxhat = dout * self.weight\n"
        "    dx = self.rstd / n * (n * dxhat - dxhat.sum(0) - self.xhat * (dxhat * self.xhat).sum(0))",
    ],
    "layernorm": [
        "It is batch norm with the statistics taken along each row (dim=1) instead of down each column.  But "
        "weight and bias are shared by all rows: their gradients still sum over the batch (dim 0).",
        "dx follows batch norm's formula with every sum taken over the row's D features (keepdim=True) and N "
        "replaced by D.",
        "    dxhat = dout * self.weight\n"
        "    dx = self.rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True)\n"
        "                          - self.xhat * (dxhat * self.xhat).sum(1, keepdim=True))\n"
        "    dweight = (dout * self.xhat).sum(0)\n    dbias = dout.sum(0)",
    ],
    "embedding": [
        "out[n, t] = weight[idx[n, t]]: row v of weight receives the gradient of every position that looked it up.",
        "Start from dweight = zeros (V, D) and add dout[n, t] into row idx[n, t] for every position.  Careful: "
        "dweight[idx] += dout does not add up repeated ids (an indexed assignment writes each row once).",
        "    dweight = torch.zeros_like(self.weight)\n"
        "    dweight.index_add_(0, self.idx.reshape(-1), dout.reshape(-1, dout.shape[-1]))\n"
        "or a loop over the positions: dweight[self.idx[n, t]] += dout[n, t].",
    ],
    "conv2d": [
        "The forward's loop adds, at each kernel offset (i, j), patch (N, C_in, H_out, W_out) times weight[:, :, "
        "i, j] (C_out, C_in).  Go through the same loop and undo each line: every out += A . B gives a gradient "
        "for A and one for B.",
        "At offset (i, j): dweight[:, :, i, j] = einsum('nohw,nchw->oc', dout, patch), summed over the batch and "
        "positions; and dxp[:, :, i:i + H_out, j:j + W_out] += einsum('nohw,oc->nchw', dout, weight[:, :, i, j]).  "
        "dbias sums dout over everything but the channel.",
        "    dxp = torch.zeros_like(self.xp)\n    dweight = torch.zeros_like(self.weight)\n"
        "    for i in range(k):\n        for j in range(k):\n"
        "            patch = self.xp[:, :, i:i + ho, j:j + wo]\n"
        "            dweight[:, :, i, j] = torch.einsum('nohw,nchw->oc', dout, patch)\n"
        "            dxp[:, :, i:i + ho, j:j + wo] += torch.einsum('nohw,oc->nchw', dout, self.weight[:, :, i, j])\n"
        "    dx = dxp[:, :, p:p + h, p:p + w]\n    dbias = dout.sum((0, 2, 3))",
    ],
    "maxpool2d": [
        "A max passes its input through unchanged and ignores the rest: the derivative is 1 for the winner of the "
        "window, 0 for the others.  Remember in the forward where each window's max was.",
        "forward: windows = x.unfold(2, k, s).unfold(3, k, s) is (N, C, H_out, W_out, k, k); reshape its last two "
        "axes to k*k and take .max(-1) for the values and the argmax.  backward: for each window (i, j), add "
        "dout[:, :, i, j] at its winner's place, +=, because windows can overlap.",
        "    dx = torch.zeros(self.x_shape, dtype=dout.dtype)\n"
        "    for i in range(h_out):\n        for j in range(w_out):\n"
        "            winner = torch.nn.functional.one_hot(self.arg[:, :, i, j], k * k).to(dout.dtype)  # (N, C, k*k)\n"
        "            dx[:, :, i*s:i*s + k, j*s:j*s + k] += (winner * dout[:, :, i, j, None]).view(n, c, k, k)",
    ],
    "lstm_cell": [
        "Go backwards through the forward's lines one at a time.  c_next has two consumers: it is returned (its "
        "gradient dc_next) and it makes h_next; add both.",
        "do = dh_next * tanh(c_next); dc_total = dc_next + dh_next * o * (1 - tanh(c_next)**2); di = dc_total * g, "
        "df = dc_total * c, dg = dc_total * i, dc = dc_total * f.  Then through the nonlinearities: sigmoid' = "
        "s(1 - s), tanh' = 1 - g**2; stack as i, f, g, o.",
        "    da = torch.cat([di * i * (1 - i), df * f * (1 - f), dg * (1 - g ** 2), do * o * (1 - o)], dim=1)\n"
        "    dx = da @ self.weight_ih\n    dh = da @ self.weight_hh\n"
        "and into .grad: weight_ih += da.T @ x, weight_hh += da.T @ h, bias_ih and bias_hh += da.sum(0).",
    ],
    "attention": [
        "Three steps back: out = att @ v, att = softmax(scores) row by row, scores = q @ k^T * scale.  A masked "
        "entry has att = 0 and passes no gradient, so the mask needs no special care in backward.",
        "dv = att^T @ dout and datt = dout @ v^T.  The softmax of a row: dscores = att * (datt - sum over the row "
        "of datt * att).  Then dq = dscores @ k * scale and dk = dscores^T @ q * scale: the scale of the forward "
        "comes back.",
        "    dv = self.att.transpose(1, 2) @ dout\n    datt = dout @ self.v.transpose(1, 2)\n"
        "    dscores = self.att * (datt - (datt * self.att).sum(-1, keepdim=True))\n"
        "    dq = dscores @ self.k * self.scale\n    dk = dscores.transpose(1, 2) @ self.q * self.scale",
    ],
    "gelu": [
        "out = x * Phi(x) is a product of two functions of x: differentiate it with the product rule.  Phi's "
        "derivative is phi, the normal density.",
        "d out/dx = Phi(x) + x phi(x), with Phi(x) = (1 + erf(x / sqrt(2))) / 2 and phi(x) = exp(-x^2 / 2) / "
        "sqrt(2 pi).  For approximate='tanh': out = x/2 (1 + t), t = tanh(u): the product rule gives (1 + t)/2 "
        "plus x/2 times dt/dx, and dt/dx = (1 - t^2) du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).",
        "backward, exact:\n    cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2)))\n"
        "    pdf = torch.exp(-0.5 * x ** 2) / math.sqrt(2 * math.pi)\n    dx = dout * (cdf + x * pdf)\n"
        "tanh form, with t = tanh(u) kept from the forward:\n"
        "    du = math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x ** 2)\n"
        "    dx = dout * (0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * du)",
    ],
    "broadcast": [
        "Write out one entry: out[n, c, l] = x[n, c, l] * scale[c, 0] + shift[l].  scale[c, 0] is used by every n "
        "and every l: its gradient sums over all of them.",
        "Every input's gradient is first out's shape (dout * scale for x, dout * x for scale, dout for shift), "
        "then summed back to the input's shape: over each leading axis the input lacks, and over each axis where "
        "the input has size 1 (keepdim=True, so the 1 stays).",
        "    def sum_to(g, shape):\n        while g.dim() > len(shape):\n            g = g.sum(0)\n"
        "        for axis, n in enumerate(shape):\n            if n == 1 and g.shape[axis] != 1:\n"
        "                g = g.sum(axis, keepdim=True)\n        return g\n"
        "backward: dx = sum_to(dout * scale, x.shape); dscale = sum_to(dout * x, scale.shape); "
        "dshift = sum_to(dout, shift.shape)",
    ],
    "accumulate": [
        "The whole batch's loss is one mean over N * H elements.  Split the sum into micro-batches: each "
        "micro-batch's part of the gradient is its own squared errors' gradient divided by the whole count N * H.",
        "For each micro-batch: out = layer.forward(xb), diff = out - tb, then layer.backward(2 * diff / (N * H)): "
        "the given backward adds (+=) into .grad, so the micro-batches' shares add up.  Never clear .grad inside "
        "forward_backward: a second call must add too.  zero_grad sets every p.grad = None.",
        "    count = target.numel()\n    total = 0\n"
        "    for start in range(0, len(x), self.micro_batch):\n"
        "        xb, tb = x[start:start + self.micro_batch], target[start:start + self.micro_batch]\n"
        "        diff = self.layer.forward(xb) - tb\n        total = total + (diff ** 2).sum()\n"
        "        self.layer.backward(2 * diff / count)\n    return total / count",
    ],
    "dropout": [
        "out = x * mask, element by element, where mask is fixed once the forward drew it: the backward is a "
        "product with that same mask.",
        "mask = keep / (1 - p): 0 where dropped, 1 / (1 - p) where kept (so out's expected value is x).  Keep it "
        "on self in forward; dx = dout * mask.  With p = 1 everything is dropped: the mask is zeros (1 / (1 - p) "
        "would be 1/0).  Never draw again in backward.",
        "forward:\n    self.mask = keep / (1 - self.p) if self.p < 1 else torch.zeros_like(x)\n"
        "    out = x * self.mask\nbackward:\n    dx = dout if self.mask is None else dout * self.mask",
    ],
    "gru_cell": [
        "Go backwards through the forward's lines.  h_next = (1 - z) * n + z * h is linear in n, z and h: dn, dz "
        "and h's direct share come first.  r multiplies h_n = W_hn h + b_hn inside the tanh.",
        "dn = dh_next * (1 - z), dz = dh_next * (h - n), h's direct share dh_next * z.  da_n = dn * (1 - n**2); "
        "then dr = da_n * h_n and dh_n = da_n * r.  Through the sigmoids: da_r = dr * r (1 - r), da_z = dz * z "
        "(1 - z).  dgi stacks (da_r, da_z, da_n), dgh stacks (da_r, da_z, dh_n): they differ in the n part.",
        "    dgi = torch.cat([da_r, da_z, da_n], dim=1)\n    dgh = torch.cat([da_r, da_z, dh_n], dim=1)\n"
        "    dx = dgi @ self.weight_ih\n    dh = dh_next * z + dgh @ self.weight_hh\n"
        "and into .grad: weight_ih += dgi.T @ x, weight_hh += dgh.T @ h, bias_ih += dgi.sum(0), "
        "bias_hh += dgh.sum(0).",
    ],
    "sgd_momentum": [
        "One buffer per parameter, made at its first step and kept between steps (not made anew each step).",
        "First step: buf = a copy of g.  Later: buf = momentum * buf + g (the whole g, not (1 - momentum) g).  "
        "Then d = buf, or with nesterov d = g + momentum * buf; p -= lr * d, in place.  momentum = 0 is plain SGD.",
        "    for k, p in enumerate(self.params):\n        d = p.grad\n        if self.momentum:\n"
        "            if self.buf[k] is None:\n                self.buf[k] = d.clone()\n            else:\n"
        "                self.buf[k].mul_(self.momentum).add_(d)\n"
        "            d = d + self.momentum * self.buf[k] if self.nesterov else self.buf[k]\n        p -= self.lr * d",
    ],
    "rmsprop": [
        "Keep one v per parameter (zeros, its shape), across steps.  Change each parameter in place.",
        "v = alpha v + (1 - alpha) g^2 (alpha keeps the old average); p -= lr * g / (sqrt(v) + eps), eps after "
        "the square root.  No bias correction: that is Adam's.",
        "In __init__:\n    self.v = [torch.zeros_like(p) for p in self.params]\nIn step, for each p, v:\n"
        "    v.mul_(self.alpha).add_((1 - self.alpha) * p.grad * p.grad)\n"
        "    p -= self.lr * p.grad / (v.sqrt() + self.eps)",
    ],
    "adam": [
        "Keep one m and one v per parameter (zeros, its shape) and a step count t, all across steps.  Change each "
        "parameter in place.",
        "At each step: t += 1; then per parameter: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g*g; m_hat = m / "
        "(1 - b1**t); v_hat = v / (1 - b2**t); p -= lr * m_hat / (sqrt(v_hat) + eps).  eps goes after the sqrt.",
        "In __init__:\n    self.t = 0\n    self.m = [torch.zeros_like(p) for p in self.params]\n"
        "    self.v = [torch.zeros_like(p) for p in self.params]\nIn step, after self.t += 1, for each p, m, v:\n"
        "    m.mul_(beta1).add_((1 - beta1) * p.grad)\n    v.mul_(beta2).add_((1 - beta2) * p.grad ** 2)\n"
        "    p -= self.lr * (m / (1 - beta1 ** self.t)) / ((v / (1 - beta2 ** self.t)).sqrt() + self.eps)",
    ],
    "linear_split": [
        "Look at the fused backward(): three lines, dx = dout @ weight, dweight = dout.T @ x, dbias = dout.sum(0).  "
        "Which of them does the stage before wait for?  B is that one; W is the other two, later.",
        "backward_input keeps a copy of dout (the caller may overwrite its own before W runs) in self.pending and "
        "returns dout @ self.weight; it does not touch .grad.  backward_weight does nothing when self.pending is None; "
        "else it takes the kept dout, sets self.pending = None (one W per B) and adds dout.T @ self.x and "
        "dout.sum(0) into .grad as the fused backward does.",
        "backward_input:\n    self.pending = dout.clone()\n    dx = dout @ self.weight\n"
        "backward_weight:\n    if self.pending is None:\n        return\n    dout, self.pending = self.pending, None\n"
        "    dweight, dbias = dout.T @ self.x, dout.sum(0)\n    then, for each parameter p and its gradient g:\n"
        "    if p.grad is None:\n        p.grad = torch.zeros_like(p)\n    p.grad += g",
    ],
    "tensor_parallel": [
        "Write the one-process MLP as a sum over ranks: rank r holds rows r*H/T.. of weight1 and bias1 (whole entries "
        "of h) and the same block of columns of weight2 (the entries of h it holds).  Then ask of each pass: does "
        "every rank already hold the whole result, or only its part of a sum?",
        "f: every rank holds all of x, so its forward is the identity; x feeds every rank's rows, so dx is a sum "
        "over ranks: an all-reduce in f's backward.  g: out is the sum of the ranks' partial products, an "
        "all-reduce in g's forward; each product receives the same dout, so g's backward is the identity.  The "
        "row-parallel bias is added once, after g, and its gradient goes into bias.grad once.",
        "f.forward: return xs;  f.backward: return all_reduce(dxs)\n"
        "g.forward: return all_reduce(parts);  g.backward: return douts\n"
        "ColumnParallelLinear: self.weights = shard(weight, 0, ranks); self.biases = shard(bias, 0, ranks)\n"
        "    forward: self.xs = self.f.forward(xs); return [x @ w.T + b for each rank]\n"
        "    backward: into shard(self.weight.grad, 0, ranks)[r] += dy_r.T @ x_r (and the bias's rows);\n"
        "              return self.f.backward([dy_r @ w_r for each rank])\n"
        "RowParallelLinear: self.weights = shard(weight, 1, ranks)\n"
        "    forward: outs = self.g.forward([x_r @ w_r.T for each rank]); return [out + self.bias for out in outs]\n"
        "    backward: self.bias.grad += douts[0].sum(0); douts = self.g.backward(douts);\n"
        "              shard(self.weight.grad, 1, ranks)[r] += dout_r.T @ x_r; return [dout_r @ w_r for each rank]",
    ],
    "ring_attention": [
        "Write one query block's softmax over all the keys as a combination of its softmaxes over each key block: "
        "exp(S_j - lse) = exp(S_j - lse_b) exp(lse_b - lse), with lse the log of the sum of exp over every key.  "
        "What must a running (o, lse) do when the next block arrives?  Then in the backward: which lse makes P the "
        "probabilities the output was really computed with?",
        "Merge: new = torch.logaddexp(lse, lse_b); o = exp(lse - new) * o + exp(lse_b - new) * o_b; lse = new, "
        "starting from o = 0 and lse = -inf.  Keep out and the merged lse (N, T, 1).  Backward: D = (dout * "
        "out).sum(-1, keepdim=True), once for the whole row; for every pair (query block a, key/value block b), "
        "P = exp(S - lse_a) with the merged lse, dS = P * (dout_a v_b^T - D_a), and each gradient adds (+=) "
        "its share: a key block meets every query block.",
        "forward, for r in range(R), o = 0, lse = -inf; for s in range(R): b = (r - s) % R\n"
        "    scores = qs[r] @ ks[b].transpose(1, 2) * scale;  lse_b = torch.logsumexp(scores, -1, keepdim=True)\n"
        "    o_b = torch.exp(scores - lse_b) @ vs[b];  new = torch.logaddexp(lse, lse_b)\n"
        "    o = torch.exp(lse - new) * o + torch.exp(lse_b - new) * o_b;  lse = new\n"
        "backward, for each (r, b):\n"
        "    p = torch.exp(qs[r] @ ks[b].transpose(1, 2) * scale - lses[r])\n"
        "    dvs[b] += p.transpose(1, 2) @ douts[r];  ds = p * (douts[r] @ vs[b].transpose(1, 2) - deltas[r])\n"
        "    dqs[r] += ds @ ks[b] * scale;  dks[b] += ds.transpose(1, 2) @ qs[r] * scale\n"
        "then dq, dk, dv = torch.cat(..., 1) of the blocks",
    ],
    "moe_dispatch": [
        "Write one entry: out[n] = sum over token n's kept assignments j of gates[n, j] * (x[n] @ W_e^T), e = "
        "experts[n, j].  Each factor of a product gets the other one times dout; x[n] is read by each of its "
        "kept experts, so its gradient is a sum; a dropped assignment appears nowhere in out.",
        "Per expert e, its kept (tokens, slots) = ((experts == e) & kept).nonzero(as_tuple=True).  dgates[tokens, "
        "slots] = (dout[tokens] * y_e).sum(-1); dy_e = gates[tokens, slots, None] * dout[tokens] (M, O); dW_e = "
        "dy_e^T x[tokens] (O, C); dx gets dy_e @ W_e added into its rows tokens (index_add_: a token's k experts "
        "add up).  Keep y_e, tokens and slots from the forward.",
        "forward: kept = keep(experts, K, capacity); then for each expert e:\n"
        "    tokens, slots = ((experts == e) & kept).nonzero(as_tuple=True)\n"
        "    y = x[tokens] @ self.weight[e].T;  out.index_add_(0, tokens, gates[tokens, slots, None] * y)\n"
        "backward, for each expert e: dgates[tokens, slots] = (dout[tokens] * y).sum(-1)\n"
        "    dy = gates[tokens, slots, None] * dout[tokens];  dweight[e] = dy.T @ x[tokens]\n"
        "    dx.index_add_(0, tokens, dy @ self.weight[e])\nthen weight.grad += dweight (created as zeros when None)",
    ],
}
