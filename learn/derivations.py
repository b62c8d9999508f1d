"""Why each exercise's backward is what it is: the derivation in a few lines of plain text, with shapes.

One entry per exercise: ``text`` (the derivation), ``reference`` (a function of the library's file that writes the
same textbook math beside the class, or None), ``library`` (where handgrad's own layer lives, whose backward is the
textbook: file and class) and ``page``
(the steps of ``python -m learn show``'s page that apply it, or None).  ``learn/why.py`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Derivation:
    text: str
    reference: str | None  # "conv2d_backward": in the library's file
    library: str  # "layers/linear.py: Linear"
    page: str | None  # which steps of the step-through page show it


DERIVATIONS = {
    "linear": Derivation(
        """\
out = x W^T + b          x (N, D), W (H, D), b (H,), out (N, H)
One entry: out[n,h] = sum_d x[n,d] W[h,d] + b[h].  A tensor's gradient sums over every output it touched:
  dx[n,d] = sum_h dout[n,h] W[h,d]     x[n,d] feeds every unit h of row n  ->  dx = dout @ W     (N, D)
  dW[h,d] = sum_n dout[n,h] x[n,d]     W[h,d] is used by every row n       ->  dW = dout.T @ x   (H, D)
  db[h]   = sum_n dout[n,h] * 1        b is added to every row             ->  db = dout.sum(0)  (H,)
A broadcast in the forward (b copied to N rows) is a sum in the backward.  No 1/N: when the loss is a mean,
its backward has put the 1/N into dout already.  Every gradient has its tensor's shape, so with N, D, H all
different a transposed product either cannot run or has the wrong shape; the checker's shapes are chosen so.
Gradients are added into .grad (+=): a layer used twice receives both shares, as any node used twice does.""",
        None,
        "layers/linear.py: Linear",
        "dL/dW2 = dL/dz2^T h, dL/db2 = sum_n dL/dz2, dL/dh = dL/dz2 W2, dL/dW1 and dL/db1",
    ),
    "relu": Derivation(
        """\
out = max(x, 0), element by element          x, out (N, D)
Each out[n,d] depends on x[n,d] alone, so the Jacobian is diagonal and the backward is an element-wise
product: dx[n,d] = dout[n,d] * d out[n,d] / d x[n,d].
  d max(x, 0) / dx = 1 where x > 0, 0 where x < 0   (at x = 0 there is no derivative; torch takes 0)
  dx = dout * (x > 0)                                 (N, D)
The mask is the forward's (x > 0, the same as out > 0), never dout's: the sign of the gradient says nothing
about whether the unit was on.  A gate, not a scale: the gradient passes unchanged or stops.  A unit that
is off for every example passes no gradient to its weights at all: a dead ReLU.""",
        None,
        "layers/activations.py: ReLU",
        None,
    ),
    "sigmoid": Derivation(
        """\
s = sigmoid(x) = 1 / (1 + e^-x), element by element          x, s (N, D)
  ds/dx = e^-x / (1 + e^-x)^2 = [1 / (1 + e^-x)] * [e^-x / (1 + e^-x)] = s (1 - s)
since 1 - s = e^-x / (1 + e^-x).  Diagonal Jacobian again, so
  dx = dout * s * (1 - s)                                     (N, D)
written with the output s that the forward keeps: no exp in the backward.  Both factors matter: dout * s,
with (1 - s) forgotten, is a mistake the checker names.  s (1 - s) is at most 1/4 (at x = 0, s = 1/2): each
sigmoid multiplies the gradient by 1/4 or less, so through a stack of them it shrinks unless the weights make
up for it (python -m learn trace --activation sigmoid --depth 6 shows it fall layer by layer).""",
        None,
        "layers/activations.py: Sigmoid",
        "dL/dz2 = dL/dy x y(1 - y): the sigmoid at the output",
    ),
    "tanh": Derivation(
        """\
t = tanh(x) = (e^x - e^-x) / (e^x + e^-x), element by element          x, t (N, D)
Quotient rule, with u = e^x - e^-x and w = e^x + e^-x (u' = w, w' = u):
  dt/dx = (w w - u u) / w^2 = 1 - (u/w)^2 = 1 - t^2
  dx = dout * (1 - t^2)                                                 (N, D)
with t the forward's *output*: 1 - x^2 (the input) is the usual slip.  The derivative is 1 at x = 0 and
falls to 0 as |x| grows (a saturated unit passes no gradient).  tanh(x) = 2 sigmoid(2x) - 1, so this is the
sigmoid's s (1 - s) rescaled: 1 - t^2 = 4 s (1 - s) with s = sigmoid(2x).  The exp definition is for the
derivation, not for computing: e^x is inf past x = 709 in float64 and inf / inf is nan.  Compute t with
torch.tanh, or from e^(-2|x|) (which only underflows) with the sign put back.""",
        None,
        "layers/activations.py: Tanh",
        "dL/dz1 = dL/dh x (1 - h^2): the tanh of the hidden layer",
    ),
    "gelu": Derivation(
        """\
out = x Phi(x), element by element          x, out (N, D); Phi the standard normal CDF, phi its density
  Phi(x) = (1 + erf(x / sqrt 2)) / 2        phi(x) = Phi'(x) = exp(-x^2 / 2) / sqrt(2 pi)
A product of two functions of x, so the product rule:
  d out/dx = Phi(x) + x phi(x)              dx = dout * (Phi(x) + x phi(x))          (N, D)
For x far below 0 both terms vanish (phi(x) underflows to 0, harmlessly: exp(-x^2/2) never overflows); far
above, Phi = 1 and x phi(x) = 0, so the slope is 1.  Between them the slope dips below 0 near x = -0.75.
The tanh form (GPT-2's), out = x/2 (1 + t), t = tanh(u), u = sqrt(2/pi) (x + 0.044715 x^3), is a product
and a chain:
  d out/dx = (1 + t)/2 + x/2 (1 - t^2) du/dx,     du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
Keep t from the forward; 1 - t^2 is tanh's derivative written with its output, as in exercise tanh.""",
        None,
        "layers/activations.py: GELU",
        None,
    ),
    "mse": Derivation(
        """\
L = (1/M) sum_k (input_k - target_k)^2        input, target (N, C); M = N C, every element; L a scalar
The loss is where the backward starts: dL/dL = 1, so backward() takes no dout.
  dL/dinput_k = (1/M) * 2 (input_k - target_k) * d(input_k - target_k)/dinput_k = 2 (input_k - target_k) / M
  dinput = 2 * (input - target) / input.numel()                                      (N, C)
The 2 comes from the square, the 1/M from the mean, and M counts every element (N C), not only the rows:
nn.MSELoss's mean is over all of them.  This 1/M is the only one in the whole backward pass: every layer
before it receives it inside its dout and must not divide again.""",
        None,
        "losses/mse.py: MSELoss",
        "dL/dy = dL/dL x 2(y - t)/4: the loss's own gradient (four examples, one output)",
    ),
    "softmax_cross_entropy": Derivation(
        """\
p = softmax(z) per row: p[n,j] = e^z[n,j] / sum_k e^z[n,k]     z, p (N, C); y (N,) class indices
L = (1/N) sum_n -log p[n, y_n]
Softmax's Jacobian (one row, C x C, not diagonal: every logit moves every probability of its row):
  dp_j/dz_k = p_j (delta_jk - p_k)
Only p_y is in the loss, dL/dp_j = -(1/N) delta_jy / p_y, so the sum over j keeps one term:
  dL/dz_k = sum_j dL/dp_j dp_j/dz_k = -(1/N) (1/p_y) p_y (delta_yk - p_k) = (p_k - delta_yk) / N
  dz = (p - onehot(y)) / N                                      (N, C)
The same in one line: -log p_y = -z_y + log sum_k e^z_k, whose derivative is -delta_yk + p_k.  Each row of
dz sums to 0 (adding a constant to a row's logits changes nothing).  Compute p from z - max(z) (the same
softmax, no overflow); the backward needs no log and no division by p.""",
        None,
        "losses/cross_entropy.py: CrossEntropyLoss",
        None,
    ),
    "broadcast": Derivation(
        """\
out = x * scale + shift, the three broadcast together: x (N, C, L), scale (C, 1), shift (L,) -> out (N, C, L)
Broadcasting lines shapes up from the right and copies a tensor along every axis it lacks or has as 1:
  out[n,c,l] = x[n,c,l] * scale[c,0] + shift[l]
A copy's backward is a sum: an entry used at many places of out gets the sum of their gradients.
  dscale[c,0] = sum_{n,l} dout[n,c,l] x[n,c,l]      dshift[l] = sum_{n,c} dout[n,c,l]
So each input's gradient is out's gradient (dout * scale, dout * x, dout), summed back to its own shape:
  over each leading axis the input lacks (sum(0) until the dimensions match), and
  over each axis where the input has size 1 and out does not (sum(axis, keepdim=True): the 1 stays)
Without keepdim, scale's gradient would be (C,), not (C, 1); summing the wrong axis may still broadcast, so
the shapes must be compared.  linear's bias, added to every row, is the first case: dbias = dout.sum(0).""",
        None,
        "autodiff/ops.py: TensorOps (its _unbroadcast)",
        None,
    ),
    "accumulate": Derivation(
        """\
L = (1/(N H)) sum_{n,h} (out[n,h] - target[n,h])^2 over a batch x (N, D); out = x W^T + b (N, H)
A sum splits over any partition of its terms: with micro-batches B_1, ..., B_k of the rows,
  L = sum_j L_j,   L_j = (1/(N H)) sum_{n in B_j} sum_h (out[n,h] - target[n,h])^2
and the gradient of a sum is the sum of the gradients: dL/dW = sum_j dL_j/dW.  Each micro-batch's dout is
  dout_j = 2 (out_j - target_j) / (N H)        (m_j, H): divided by the whole batch's count, not m_j H
A backward that adds (p.grad += g) makes the sum: run the k micro-batches one after another and .grad holds
dL/dW, whatever their sizes.  Averaging the micro-batches' own means is right only when all m_j are equal.
The same += is why a second backward without zero_grad doubles .grad: the optimizer would step with the
sum of two batches' gradients.  zero_grad (p.grad = None) between batches, never inside one.
Only the memory of one micro-batch's activations is held at a time: the price is k forward passes of m_j rows.""",
        None,
        "optimizers/base.py: HandOptimizer (its zero_grad)",
        None,
    ),
    "value": Derivation(
        """\
Every Value is a node of a graph that ends in one scalar L; node.grad means dL/dnode (a float).
At one node out = f(a, b), the chain rule sends back dL/da += dL/dout * df/da (and the same for b):
  a + b: 1, 1     a * b: b, a     x ** n: n x^(n - 1)     tanh: 1 - t^2 (t its output)     exp: e^x (its output)
A node used by several later nodes gets the sum of what each sends (the multivariable chain rule):
  dL/da = sum over the nodes u that use a of dL/du * du/da    ->  += , never =   (a * a: a + a = 2a)
A node may send its gradient on only once it is complete, i.e. after every node that uses it has sent
its share: visit the nodes in reverse topological order (each node after all of its users).  Build the
order by a depth-first walk, with an explicit stack: a chain of 3,000 nodes is deeper than Python's
recursion limit (about 1,000).  Start with L.grad = 1 (dL/dL).  One visit per edge, as many as the forward
made: reverse mode gives the gradient with respect to every input in one pass (micrograd's engine).""",
        None,
        "autodiff/engine.py: Tensor (its backward and _topological_order)",
        "every backward step: dL/dL = 1 first, then each gradient once all its users have sent theirs",
    ),
    "dropout": Derivation(
        """\
In training: keep ~ Bernoulli(1 - p) element by element (p: the probability of dropping, torch's meaning)
  mask = keep / (1 - p)       out = x * mask        x, mask, out (N, D)
E[out] = x (1 - p) / (1 - p) = x: at test time the layer is the identity, no rescaling needed ("inverted").
Once drawn, the mask is a constant of this forward: out is x times a fixed tensor, element by element, so
  dx = dout * mask                                                (N, D)
the same mask: a dropped element did not reach out (gradient 0), a kept one is scaled by 1/(1 - p) both ways.
Drawing a new mask in backward, or dropping the 1/(1 - p), gives another function's gradient.
p = 1 drops everything: out = 0 and dx = 0 (1/(1 - p) is 1/0: zeros, not nan).  p = 0 and eval: identity.
The mask must be kept from forward to backward: a seeded generator makes the draws repeatable, which is how
the checker replays them and how a twin model drops the same elements.""",
        None,
        "layers/dropout.py: Dropout",
        None,
    ),
    "batchnorm": Derivation(
        """\
One column (a feature d; drop the index), over the batch n = 1..N, with r = 1/sqrt(var + eps):
  mu = (1/N) sum_n x_n;  var = (1/N) sum_n (x_n - mu)^2;  xhat_n = (x_n - mu) r;  out_n = gamma xhat_n + beta
dbeta = sum_n dout_n, dgamma = sum_n dout_n xhat_n (D,); and g_n = dL/dxhat_n = dout_n gamma (N, D).
x_i reaches the loss by three paths: xhat_i directly, and every xhat_n through mu and through var.
  direct:  g_i r
  var:     dL/dvar = sum_n g_n (x_n - mu) (-1/2)(var + eps)^(-3/2);  dvar/dx_i = 2 (x_i - mu)/N
           (var's own dependence on mu adds (-2/N) sum_n (x_n - mu) = 0)  ->  -(r/N) xhat_i sum_n g_n xhat_n
  mean:    dL/dmu = -r sum_n g_n (var's share is that same 0);  dmu/dx_i = 1/N  ->  -(r/N) sum_n g_n
  dx_i = (r/N) (N g_i - sum_n g_n - xhat_i sum_n g_n xhat_n)            dx (N, D), sums over dim 0
Treat mu and var as constants and only the first term is left: a mistake the checker names.
var is the biased one (divided by N, as PyTorch normalises); eps goes inside the square root.""",
        None,
        "layers/batchnorm.py: BatchNorm1d",
        None,
    ),
    "layernorm": Derivation(
        """\
Batch norm turned sideways: the statistics are over each row's D features instead of down each column.
Per row n, with r_n = 1/sqrt(var_n + eps) and g = dout * gamma (N, D):
  mu_n = (1/D) sum_d x[n,d];  var_n = (1/D) sum_d (x[n,d] - mu_n)^2;  xhat = (x - mu) r   (N, D)
The same three paths (direct, through mu_n, through var_n), with every sum over the row, keepdim:
  dx = r / D * (D g - g.sum(1, keepdim=True) - xhat * (g * xhat).sum(1, keepdim=True))    (N, D)
But gamma and beta (D,) are shared by every row, as batch norm's are, so their sums are still over dim 0:
  dgamma = (dout * xhat).sum(0),  dbeta = dout.sum(0)                                       (D,)
Which axis a gradient sums over is the lesson: the statistics' axis for dx, the batch for the parameters.
Each row of dx sums to 0: adding a constant to a row of x does not change its xhat.""",
        None,
        "layers/layernorm.py: LayerNorm",
        None,
    ),
    "embedding": Derivation(
        """\
out[n,t,:] = W[idx[n,t], :]          W (V, D), idx (N, T) int64, out (N, T, D)
A lookup is a product with a one-hot matrix: out = onehot(idx) W with onehot (N T, V); as for linear,
dW = onehot^T dout, whose row v is the sum of dout[n,t] over every position where idx[n,t] = v:
  dW = zeros(V, D);  dW.index_add_(0, idx.reshape(-1), dout.reshape(-1, D))          (V, D)
An id seen k times gets k gradients, added.  dW[idx] += dout does not add them: an indexed assignment
writes each repeated row once (one position's gradient survives, the others are lost).  A row nobody looked
up gets 0.  The ids are integers, not a function of anything learnable: backward returns no dx.""",
        None,
        "layers/embedding.py: Embedding",
        None,
    ),
    "conv2d": Derivation(
        """\
With xp the zero-padded input (N, C_in, H + 2p, W + 2p) and k x k kernels (a cross-correlation, as torch):
  out[n,o,y,x] = b[o] + sum_{c,i,j} W[o,c,i,j] xp[n,c,y+i,x+j]         out (N, C_out, H_out, W_out)
One weight is used at every position of every example, so its gradient sums over all of them:
  dW[o,c,i,j] = sum_{n,y,x} dout[n,o,y,x] xp[n,c,y+i,x+j]              (C_out, C_in, k, k)
  db[o]       = sum_{n,y,x} dout[n,o,y,x]                              (C_out,)
One input pixel is seen by up to k^2 positions of each output channel, so its gradient sums over those:
  dxp[n,c,Y,X] = sum_{o,i,j} dout[n,o,Y-i,X-j] W[o,c,i,j]             (the out-of-range terms are 0)
Written as one operation, that is a 'full' convolution of dout with the flipped kernel (a transposed
convolution); written as the forward's loop over offsets (i, j), it needs no flip: each out += W[:,:,i,j] . patch
gives dW[:,:,i,j] = einsum('nohw,nchw->oc', dout, patch) and dxp[:,:,i:i+H_out, j:j+W_out] +=
einsum('nohw,oc->nchw', dout, W[:,:,i,j]), W[:,:,i,j] itself.  dx is dxp with the padding cut off (the pad is a
constant: its gradient goes nowhere).""",
        "conv2d_backward",
        "layers/conv.py: Conv2d",
        None,
    ),
    "maxpool2d": Derivation(
        """\
out[n,c,i,j] = max of the window x[n,c, i s : i s + k, j s : j s + k]      x (N, C, H, W)
A max is locally one of its inputs: d out / d x = 1 for the window's winner (its argmax, kept from the
forward; on a tie, the first in row-major order, as torch picks) and 0 for the k^2 - 1 others.  So the backward
multiplies nothing, it routes:
  dx = zeros(N, C, H, W);  for each window: dx[n, c, winner] += dout[n, c, i, j]
With s < k the windows overlap and an input can win two of them: +=, as everywhere.  Inputs that never win
get exactly 0, and a small change to them does not move the loss at all.  The argmax must be the forward's:
recomputing it from dout, or sending dout to every entry of the window, is wrong.""",
        None,
        "layers/pool.py: MaxPool2d",
        None,
    ),
    "lstm_cell": Derivation(
        """\
a = x Wih^T + bih + h Whh^T + bhh (N, 4H) -> ai, af, ag, ao (N, H), in torch's order i, f, g, o
i, f, o = sigmoid(ai, af, ao);  g = tanh(ag);  c' = f c + i g;  h' = o tanh(c')
c' has two consumers, the returned state (dc' arrives) and h' (through o tanh(c')), so it gets both:
  dc_total = dc' + dh' * o * (1 - tanh(c')^2)          do = dh' * tanh(c')                   (N, H)
Through c' = f c + i g, a product rule for each term:
  di = dc_total * g,  dg = dc_total * i,  df = dc_total * c,  dc = dc_total * f            (N, H)
Through the gates: dai = di i(1 - i), daf = df f(1 - f), dao = do o(1 - o), dag = dg (1 - g^2)
  da = cat([dai, daf, dag, dao], 1)                    (N, 4H), stacked as the forward cut a
  dx = da Wih (N, I);  dh = da Whh (N, H);  dWih += da^T x (4H, I);  dWhh += da^T h (4H, H)
  dbih += da.sum(0) and dbhh += da.sum(0): both biases are added to a, so both get the same gradient.
dc = dc_total * f reaches the previous cell with no matrix and no squashing: with f near 1 the gradient
crosses many steps unchanged, the reason an LSTM remembers further back than a plain RNN.""",
        "lstm_step, lstm_step_backward",
        "layers/recurrent/cells.py: LSTMCell",
        None,
    ),
    "gru_cell": Derivation(
        """\
gi = x Wih^T + bih, gh = h Whh^T + bhh (N, 3H) -> (i_r, i_z, i_n), (h_r, h_z, h_n), torch's order r, z, n
r = sigmoid(i_r + h_r);  z = sigmoid(i_z + h_z);  n = tanh(i_n + r * h_n);  h' = (1 - z) n + z h
h' is linear in n, z and h:
  dn = dh' (1 - z)        dz = dh' (h - n)        h's direct share: dh' z                   (N, H)
Through n = tanh(a_n), a_n = i_n + r * h_n (r multiplies h_n, a product rule):
  da_n = dn (1 - n^2);    dr = da_n * h_n;    dh_n = da_n * r
Through the sigmoids: da_r = dr r (1 - r), da_z = dz z (1 - z).  Stacked as the forward cut them:
  dgi = [da_r, da_z, da_n],  dgh = [da_r, da_z, dh_n]      (N, 3H): they differ in the n part, by r
  dx = dgi Wih (N, I);  dh = dh' z + dgh Whh (N, H);  dWih += dgi^T x;  dWhh += dgh^T h
  dbih += dgi.sum(0);  dbhh += dgh.sum(0)            (3H,): the n parts differ, unlike the LSTM's two biases
The reset gate inside the product is PyTorch's (and cuDNN's) choice; the GRU paper puts it on h before Whn.
With z near 1, dh = dh' z + ... passes the gradient to the previous step almost unchanged, as the LSTM's f.""",
        "gru_step, gru_step_backward",
        "layers/recurrent/cells.py: GRUCell",
        None,
    ),
    "attention": Derivation(
        """\
S = s q k^T (N, T, T), s = 1/sqrt(d);  S[t, u] = -inf for u > t (the future);  A = softmax(S) per row;
out = A v (N, T, d).  Backwards, one line at a time:
  dv = A^T dout   (N, T, d)             dA = dout v^T   (N, T, T)
Softmax of one row a = A[t, :]: da_j/dS_u = a_j (delta_ju - a_u), so
  dS_u = sum_j dA_j a_j (delta_ju - a_u) = a_u (dA_u - sum_j dA_j a_j)
  dS = A * (dA - (dA * A).sum(-1, keepdim=True))   (N, T, T): a row dot product, no T x T Jacobian built
A masked entry has A = 0, hence dS = 0: the mask needs nothing in the backward.
  dq = s dS k  (N, T, d)                dk = s dS^T q  (N, T, d)
The scale is in both directions: S = s q k^T, so each derivative of S carries s.  Why 1/sqrt(d): with
entries of q and k of variance 1, q . k has variance d; unscaled, the softmax saturates (A nearly one-hot)
and dS = A * (dA - ...) is nearly 0 everywhere: no gradient reaches q and k.""",
        "attention_forward, attention_backward",
        "layers/attention/scaled_dot_product.py: ScaledDotProductAttention",
        None,
    ),
    "sgd_momentum": Derivation(
        """\
Not a backward: the update that uses one.  Per parameter p (any shape, (N, D) say) with g = p.grad:
  buf_1 = g;   buf_t = mu buf_(t-1) + g          d = buf_t  (Nesterov: d = g + mu buf_t)      p -= lr d
Unrolled, buf_t = sum_(s<=t) mu^(t-s) g_s: with a steady gradient g it tends to g / (1 - mu), so momentum
0.9 takes steps ten times lr g along a direction the gradients agree on, while directions where they flip
sign cancel out.  torch adds the whole g (no (1 - mu) factor: that would be an average, a step 1/(1 - mu)
times smaller) and starts the buffer at g itself, a copy.
Nesterov's looks ahead: the step is taken as if from where the momentum is about to carry p, which in
this form is g + mu buf_t.  With mu = 0 both are plain SGD, p -= lr g.
The buffer is state: one per parameter, kept between steps; made anew at every step, momentum is lost.""",
        None,
        "optimizers/sgd.py: SGD",
        None,
    ),
    "rmsprop": Derivation(
        """\
Not a backward: the update that uses one.  Per parameter p (any shape, (N, D) say) with g = p.grad:
  v_t = alpha v_(t-1) + (1 - alpha) g_t^2        (v_0 = 0, v of p's shape)
  p -= lr g_t / (sqrt(v_t) + eps)
v is a moving average of g^2, so sqrt(v) is each entry's typical gradient size: every entry takes a step of
about lr in its own units, a large gradient no larger a step than a small one.  Dividing by v itself (no
sqrt) would make the step shrink like 1/|g|.  eps keeps the step finite where v is ~0; it is added after
the square root (inside, sqrt(v + 1e-8) = 1e-4 would swamp small gradients).
No bias correction: v starts at 0, so the first steps are larger than lr by 1/sqrt(1 - alpha) (3.2 for
alpha = 0.9); Adam corrects this, torch's RMSprop does not.  Adam is RMSprop with a moving average of g (m)
in place of g, and both corrections.""",
        None,
        "optimizers/rmsprop.py: RMSprop",
        None,
    ),
    "adam": Derivation(
        """\
Not a backward: the update that uses one.  Per parameter p with g = p.grad (m, v of p's shape, both 0 at t = 0):
  m_t = b1 m_(t-1) + (1 - b1) g_t          v_t = b2 v_(t-1) + (1 - b2) g_t^2
Unrolled, m_t = (1 - b1) sum_(s<=t) b1^(t-s) g_s; if the g_s share a mean E[g], E[m_t] = (1 - b1^t) E[g]:
an average that starts at 0 is too small by exactly that factor.  Hence the bias correction
  m_hat = m_t / (1 - b1^t)      v_hat = v_t / (1 - b2^t)      p -= lr m_hat / (sqrt(v_hat) + eps)
At t = 1, m_hat = g and v_hat = g^2: every parameter moves by about lr * sign(g).  Without the correction
the step is lr (1 - b1^t)/sqrt(1 - b2^t) m_hat/sqrt(v_hat): 3.2 lr at t = 1, 6.6 lr at t = 12, still
1.26 lr at t = 1000 (b1 = 0.9, b2 = 0.999): too large for thousands of steps.  eps is added after the
square root (inside it, sqrt(v_hat + 1e-8) = 1e-4 would swamp small gradients).  m_hat/sqrt(v_hat) does not
change when the loss is multiplied by a constant: Adam's step size is set by lr, not by the gradient's scale.""",
        None,
        "optimizers/adam.py: Adam",
        None,
    ),
    "linear_split": Derivation(
        """\
out = x W^T + b, x (N, D), W (H, D); the backward is three products on dout (N, H), two of them independent:
  dx = dout @ W      (N, D)    needs dout and W                 -> B, backward_input: the stage before waits
  dW = dout^T @ x    (H, D)    needs dout and x, not dx         -> W, backward_weight: nobody waits for it
  db = dout.sum(0)   (H,)      needs dout alone                 -> W
No term of dW or db reads dx, and dx reads neither: the split is a split of lines, not of math.  B must keep
what W reads, dout (a copy: a pipeline receives the next micro-batch's dout into the same buffer) and x; W
uses it up, so a second W has nothing to add.  Run as the fused backward runs them, the same operations on the
same tensors give the same bits: B then W equals backward() exactly, not to round-off.
Why bother: with P stages and M micro-batches, 1F1B idles (P - 1)/(M + P - 1) of the time; each stage's W
passes can fill those idle slots (ZB-H1, Qi et al. 2023), because only B is on the path between stages.
In a layer where dW shares work with dx (layer norm's xhat, attention's packed q, k, v), B computes the shared
part once and keeps it for W.  The micro-batches' W add into .grad in a fixed order, B's order, so the sum
is the same whatever the schedule delays.""",
        None,
        "layers/linear.py: Linear (backward_input, backward_weight)",
        None,
    ),
    "tensor_parallel": Derivation(
        """\
One process: h = tanh(x W1^T + b1), out = h W2^T + b2;  x (N, D), W1 (H, D), W2 (O, H).  T ranks, H/T each.
Column-parallel W1: rank r holds rows W1_r (H/T, D), b1_r; h_r = tanh(x W1_r^T + b1_r) (N, H/T) is an exact slice
of h, so tanh needs no communication.  Row-parallel W2: rank r holds columns W2_r (O, H/T), the ones h_r meets:
  out = h W2^T + b2 = sum_r h_r W2_r^T + b2          (each term (N, O))  -> g's forward: an all-reduce; b2 once
Backward.  out is a sum, so each term's gradient is dout itself: g's backward is the identity, and
  dW2_r = dout^T h_r (O, H/T),  dh_r = dout W2_r (N, H/T),  db2 = dout.sum(0) (O,), the same on every rank
  da_r = dh_r (1 - h_r^2),  dW1_r = da_r^T x (H/T, D),  db1_r = da_r.sum(0)     each on its own rank
x feeds every rank's rows, so its gradient sums their contributions:
  dx = sum_r da_r W1_r   (N, D)                       -> f's backward: an all-reduce; f's forward the identity
f and g are conjugate: the identity one way, the sum the other.  Two all-reduces of (N, D) or (N, O) values
per MLP per step, one each way; an all-reduce in the wrong pass adds T copies (T x, T dout), a bias added per
rank is added T times.  Every shard's gradient is the slice of the one-process gradient: gathered, equal.""",
        None,
        "training/parallel/tp_layers.py: ColumnParallelLinear (RowParallelLinear beside it; f and g in "
        "training/parallel/tp_mappings.py)",
        None,
    ),
    "ring_attention": Derivation(
        """\
Row t of the output over all keys j, split into blocks b:  out_t = sum_j P_tj v_j,  P_tj = exp(S_tj - lse_t),
lse_t = log sum_j exp(S_tj) = log sum_b exp(lse_tb)       S (N, T, T), lse (N, T, 1), one block (N, n, n)
since sum over block b of exp(S_tj) = exp(lse_tb).  So the softmax over the union is a weighted mean of the
blocks' softmaxes:  out_t = sum_b exp(lse_tb - lse_t) o_tb,  each o_tb = the block's own softmax times v_b.
Merging one block at a time keeps this exact: new = logaddexp(lse, lse_b); o = exp(lse - new) o + exp(lse_b -
new) o_b.  The old o was divided by exp(lse); re-weighting by exp(lse - new) divides it by exp(new) instead
(the online softmax's rescaling by the new max).  The weights then sum to 1: max(lse, lse_b) would not.
Backward, with the merged lse kept:  P = exp(S - lse) is the final softmax's block -- the block's own lse
would give probabilities that sum to 1 over its keys alone.  Softmax's Jacobian needs a sum over the row,
  dS_tj = P_tj (dP_tj - D_t),   D_t = sum_j P_tj dP_tj = sum_j P_tj (dout_t . v_j) = dout_t . out_t   (N, T, 1)
and that last form is known before any block arrives.  Then, per block, as in attention:
  dv_b += P^T dout_a (n, d)    dq_a += dS k_b scale (n, d)    dk_b += dS^T q_a scale (n, d)
A key block meets every rank's queries, so dk_b and dv_b are sums over the ring: they travel with the block
(the causal ring skips blocks in the future; its diagonal block is masked; the sums are the same).""",
        "attend_block_backward merge",
        "training/parallel/ring_attention.py: RingAttention",
        None,
    ),
    "moe_dispatch": Derivation(
        """\
out[n] = sum_j kept[n,j] g[n,j] y_e[n],  y_e = x_e W_e^T,  e = experts[n,j]   x (N, C), g (N, k), W (K, O, C)
The combine is a sum of products: each factor's gradient is dout times the other factor.
  dg[n,j] = dout[n] . y_e[n]           (N, k)     the router's signal: how much expert e helped token n
  dy_e[m] = g[n,j] dout[n]             (M, O)     the expert's output receives dout scaled by its gate
  dW_e = dy_e^T x_e                    (O, C)     over expert e's M kept tokens
The dispatch x_e = x[tokens_e] is a gather; the backward of a gather is a scatter-add:
  dx[n] = sum over n's kept assignments j of dy_e[m] W_e    (N, C)   a token read by k experts gets k shares
An assignment past the expert's capacity appears in no term of out, so it gets nothing: dg = 0 and no share
of dx or dW.  experts and kept are chosen by comparisons (top-k, a queue): piecewise constant, no gradient.
In the full layer dg continues through top-k (scattered to the chosen p, 0 elsewhere), the softmax and the
router's Linear; expert parallelism sends x_e to the expert's rank and y_e back, and the backward reverses
both (dy_e out, dx_e back): the same sums, moved by all-to-all.""",
        "route gelu_grad",
        "layers/moe.py: MixtureOfExperts",
        None,
    ),
}
