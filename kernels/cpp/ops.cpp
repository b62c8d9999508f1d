// The schemas of the handgrad:: operators: each is registered here once, its CPU kernel in its family's file
// (TORCH_LIBRARY_IMPL), and its fake (shape-only) implementation in kernels/cpp/__init__.py, so that
// torch.compile traces a step that calls them as one graph.  Outputs are new tensors unless the schema marks an
// argument as written ((a!)): the optimizers' updates and the recurrent steps write into buffers they are given.
#include "common.h"

TORCH_LIBRARY(handgrad, m) {
  // norms.cpp
  m.def("layer_norm_forward(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_backward(Tensor dout, Tensor x, Tensor mean, Tensor rstd, Tensor? weight)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("batch_norm_forward(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("batch_norm_backward(Tensor dout, Tensor x, Tensor mean, Tensor rstd, Tensor? weight, bool need_dx)"
        " -> (Tensor, Tensor, Tensor)");
  // elementwise.cpp
  m.def("gelu_backward(Tensor x, Tensor out, Tensor dout) -> Tensor");
  m.def("gelu_tanh_backward(Tensor x, Tensor dout) -> Tensor");
  // softmax.cpp
  m.def("cross_entropy_forward(Tensor logits, Tensor target, float label_smoothing) -> (Tensor, Tensor)");
  m.def("cross_entropy_backward(Tensor logp, Tensor target, float scale, float label_smoothing) -> Tensor");
  // optimizers.cpp
  m.def("sgd_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] bufs, float lr, float momentum,"
        " float dampening, float weight_decay, bool nesterov) -> ()");
  m.def("adam_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs,"
        " float[] neg_step_sizes, float[] eps_hats, float beta1, float beta2, float weight_decay, float decay)"
        " -> ()");
  // recurrent.cpp: one time step's gates, writing into the step's slices of the sequence's buffers
  m.def("lstm_gates_forward(Tensor a, Tensor c_prev, Tensor(a!) act, Tensor(b!) c, Tensor(c!) tanh_c, Tensor(d!) r)"
        " -> ()");
  m.def("lstm_gates_backward(Tensor dr, Tensor act, Tensor c_prev, Tensor tanh_c, Tensor(a!) dc, Tensor(b!) da)"
        " -> ()");
  m.def("gru_gates_forward(Tensor(a!) act, Tensor m, Tensor h_prev, Tensor(b!) m_n, Tensor(c!) h) -> ()");
  m.def("gru_gates_backward(Tensor d, Tensor act, Tensor m_n, Tensor h_prev, Tensor(a!) carry, Tensor(b!) dm,"
        " Tensor(c!) da_n) -> ()");
  // attention.cpp: q, k, v, dout (B, L, E) or, heads apart, (B, H, L, E), rows contiguous; a 4-D input's out, dq, dk
  // and dv come back laid out (B, L, H, E), the heads side by side
  m.def("attention_forward(Tensor q, Tensor k, Tensor v, float scale, bool causal, int block) -> (Tensor, Tensor)");
  m.def("attention_backward(Tensor q, Tensor k, Tensor v, Tensor dout, Tensor D, Tensor lse, float scale,"
        " bool causal, int block) -> (Tensor, Tensor, Tensor)");
  m.def("attention_backward_into(Tensor q, Tensor k, Tensor v, Tensor dout, Tensor D, Tensor lse, float scale,"
        " bool causal, int block, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv) -> ()");
  // pool.cpp
  m.def("max_pool2d_backward(Tensor dout, Tensor idx, int hw) -> Tensor");
}
