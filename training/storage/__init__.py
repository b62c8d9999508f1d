"""A run's folder and its safety: atomic writes, the lock, checkpoints sealed with their checksum, the data's fingerprint."""
