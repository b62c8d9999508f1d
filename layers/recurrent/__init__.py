"""The recurrent layers: RNN, LSTM and GRU (``rnn.py``, on the stacking of layers and directions they share,
``stacked.py``), their one-step cells, the cells' equations and the loop over time that calls them, backpropagation
through time (``cells.py``).  The kernels behind them are in kernels/recurrent/."""

from .cells import GRUCell, LSTMCell, RNNCell
from .rnn import GRU, LSTM, RNN

__all__ = ["RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"]
