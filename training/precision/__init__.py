"""Mixed precision by hand: float32 master weights and the dynamic loss scaler of float16 training."""
