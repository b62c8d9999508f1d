"""What checks the parallel mechanism, apart from it: ``--check-parity`` (parity.py: the first step sharded against
one process, round-off or bug), the ranks' agreement on settings and data (agreement.py), the torch twins the
hand-written splits are tested against (tp_twin.py: DTensor's tensor parallelism; pipeline_twin.py:
torch.distributed.pipelining; twin_syncbn.py: the nn.Module twin's synchronised batch norm under DDP), and the
pipeline's timeline report and its picture (pipeline_report.py, pipeline_plot.py)."""
