"""llama.cpp's `ssm_a = -exp(A_log)` read back (flexlamps.models.loading.gguf_hybrid.decay_log):
the forward's `-exp(A_log)` gives the file's value bit for bit."""

import torch

from flexlamps.models.loading.gguf_hybrid import decay_log


def test_decay_log_gives_back_every_stored_decay_exactly():
    """100k decay rates drawn as transformers draws them (log of U(0.01, 16)): each A_log read back
    gives the stored -exp(A_log) exactly; the nearest float32 to log(-a) alone misses some (measured
    6 of 100000), which the search around it finds."""
    a_log = torch.log(torch.empty(100_000).uniform_(0.01, 16, generator=torch.Generator().manual_seed(0)))
    stored = -a_log.exp()
    assert torch.equal(-decay_log(stored).exp(), stored)
    nearest = torch.log(-stored.double()).float()
    assert not torch.equal(-nearest.exp(), stored)
