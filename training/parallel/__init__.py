"""Training under torchrun: the process group, the data shard, the hand-written bucketed all-reduce; model
parallelism by hand -- tensor (tp_*.py), sequence, context (ring_attention.py, cp_gpt.py), pipeline (pipeline_*.py),
ZeRO (zero.py) -- and the process groups when they share the world (layout.py); train.py's model-parallel run
over them (run.py) and its checkpoint (checkpoint.py).  What checks all this -- --check-parity, the ranks'
agreement, the torch twins, the pipeline's timeline report -- is in verify/; see docs/model-parallel.md.  Import
from the modules (the twins import torch.distributed's DTensor and pipelining, which the rest of the trainer does
not need)."""
