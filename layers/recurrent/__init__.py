"""The recurrent layers: RNN, LSTM and GRU (``rnn.py``, on the stacking of layers and directions they share,
``stacked.py``), their one-step cells (``cells.py``), backpropagation through time for one direction of one layer
(``bptt.py``; ``bptt_graph.py``, the same as torch.compile traces it) and its matrix products (``matmul.py``)."""
from .cells import GRUCell, LSTMCell, RNNCell
from .rnn import GRU, LSTM, RNN

__all__ = ["RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"]
