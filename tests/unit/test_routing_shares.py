"""The routing profile's arithmetic: expected distinct experts a step reads, hottest-first order."""

import pytest

from placement.routing import RoutingProfile


def test_uniform_routing_reads_k_experts_for_one_token_and_all_for_many():
    r = RoutingProfile.uniform(32, 2)
    assert r.expected_distinct(0, 1) == pytest.approx(2.0)
    assert r.expected_distinct(0, 8) == pytest.approx(32 * (1 - (1 - 2 / 32) ** 8))
    assert r.expected_distinct(0, 10_000) == pytest.approx(32.0)
    assert r.expert_order(0) == list(range(32))


def test_skewed_routing_reads_fewer_experts_and_orders_the_hot_ones_first():
    counts = [50, 30, 10, 10]  # 50 tokens, 2 picks each
    r = RoutingProfile(4, 2, 50, {"3": counts})
    assert r.pick_shares(3) == [1.0, 0.6, 0.2, 0.2]
    assert r.expert_order(3) == [0, 1, 2, 3]
    assert r.expected_distinct(3, 4) < RoutingProfile.uniform(4, 2).expected_distinct(3, 4)
    assert r.pick_shares(0) == [0.5] * 4  # an unmeasured layer: uniform
    assert RoutingProfile.from_json(r.to_json()) == r


@pytest.mark.parametrize("args, match", [((4, 5), "5 experts per token of 4"),
                                         ((4, 2, 10, {"0": [1, 2]}), "layer 0 has 2 counts")])
def test_bad_profiles_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        RoutingProfile(*args)
