"""The recurrent-state cache's traffic: a decode step reads consecutive rows in place and writes
back only the parts its step changed (the boundary state stays until its chunk completes)."""

import torch

from flexlamps.engine.caches.state import StateCache
from flexlamps.models.blocks.gated_deltanet import CHUNK, chunk_rule_with_boundaries
from flexlamps.models.hybrid_config import HybridConfig

HY = HybridConfig(layer_types=("linear_attention",), num_key_heads=1, num_value_heads=2, key_head_dim=4,
                  value_head_dim=4, conv_kernel=3, rotary_dim=4, fused_projections=False)


def test_consecutive_rows_are_read_in_place_and_an_unchanged_part_is_not_written():
    cache = StateCache(HY, 4, torch.float32, ["gpu"])
    cache.recurrent[0].normal_()
    cache.held[:] = 5
    access = cache.access(0, cache.begin_step(torch.tensor([1, 2]), torch.tensor([[5], [5]]), None))
    conv, boundary, open_chunk = access.read()
    assert boundary.data_ptr() == cache.recurrent[0][1].data_ptr()  # a view, not a copy
    before = cache.recurrent[0].clone()
    access.write(conv + 1, boundary.clone() + 1, open_chunk)  # changed parts are written back
    assert torch.equal(cache.recurrent[0][1:3], before[1:3] + 1) and torch.equal(cache.conv[0][1:3], conv)
    again = cache.access(0, cache.begin_step(torch.tensor([1, 2]), torch.tensor([[6], [6]]), None))
    conv, boundary, open_chunk = again.read()
    written = []
    cache.recurrent[0] = _Spy(cache.recurrent[0], written)
    again.write(conv, boundary, open_chunk)  # the boundary handed back as read: not copied back
    assert written == []
    scattered = cache.access(0, cache.begin_step(torch.tensor([3, 0]), torch.tensor([[0], [5]]), None))
    _, rows_read, _ = scattered.read()
    assert rows_read.data_ptr() != cache.recurrent[0][3].data_ptr() and not rows_read[0].any()  # fresh: zeros
    assert torch.equal(rows_read[1], cache.recurrent[0][0])


class _Spy(torch.Tensor):
    """A cache tensor that records index assignments."""

    def __new__(cls, data, log):
        spy = torch.Tensor._make_subclass(cls, data)
        spy.log = log
        return spy

    def __setitem__(self, index, value):
        self.log.append(index)
        super().__setitem__(index, value)


def test_a_step_that_completes_no_chunk_hands_back_the_boundary_state_it_was_given():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, CHUNK, 1, 4, generator=g), torch.randn(2, CHUNK, 1, 4, generator=g), \
        torch.randn(2, CHUNK, 2, 4, generator=g)
    decay, beta = -torch.rand(2, CHUNK, 2, generator=g), torch.rand(2, CHUNK, 2, generator=g)
    state = torch.randn(2, 2, 4, 4, generator=g)
    _, _, kept = chunk_rule_with_boundaries(q, k, v, decay, beta, state, torch.tensor([0, 0]))
    assert kept is state
    _, _, completed = chunk_rule_with_boundaries(q, k, v, decay, beta, state, torch.tensor([0, 1]))
    assert completed is not state and torch.equal(completed[0], state[0]) and not torch.equal(completed[1], state[1])


def test_a_row_started_anew_in_a_used_slot_gets_zeros_written_even_when_no_chunk_completes():
    """A refilled slot's new sequence reads zeros; its boundary state (handed back unchanged by a
    short step) must still replace the previous sequence's in the cache."""
    cache = StateCache(HY, 2, torch.float32, ["gpu"])
    cache.recurrent[0].normal_()
    cache.held[:] = 40
    access = cache.access(0, cache.begin_step(torch.tensor([0, 1]), torch.tensor([[0, 1, 2], [40, 41, 42]]), None))
    conv, boundary, open_chunk = access.read()
    kept = cache.recurrent[0][1].clone()
    access.write(conv, boundary, open_chunk)  # as a step completing no chunk hands it back
    assert not cache.recurrent[0][0].any() and torch.equal(cache.recurrent[0][1], kept)
