"""Shared test settings."""
import torch

# The suite runs as two pytest workers on two cores; one thread each avoids OpenMP threads competing
# for the same core, which makes small tensor operations many times slower.
torch.set_num_threads(1)
