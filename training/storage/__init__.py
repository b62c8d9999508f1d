"""A run's folder and its safety: atomic writes, the lock, checksum-sealed checkpoints, the data's fingerprint."""
