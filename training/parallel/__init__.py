"""Training under torchrun: the process group, the data shard, the hand-written bucketed all-reduce, ranks that agree;
model parallelism by hand -- tensor (tp_*.py), sequence, pipeline (pipeline_*.py), ZeRO (zero.py) -- and the
process groups when they share the world (layout.py); train.py's model-parallel run over them (run.py) and its
--check-parity (parity.py); see docs/model-parallel.md.  Import from the modules (the
twins import torch.distributed's DTensor and pipelining, which the rest of the trainer does not need)."""
