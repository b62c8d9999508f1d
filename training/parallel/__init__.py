"""Training under torchrun: the process group, the data shard, the hand-written bucketed all-reduce, ranks that agree."""
