"""The pieces of torch's parameter server (backends/torch/ps.py): the model and its checkpoint
files, a server's state and the RPC handlers trainers call, a trainer's batches split over the
servers."""
