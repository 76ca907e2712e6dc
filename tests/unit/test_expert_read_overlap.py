"""A MoE layer's routed experts are read while the forward computes: the routing hint starts
every read at once and a read of one expert waits for that expert only (`LayerWeights` with
`begin`), so the experts the router picked first are computed while later ones are still read."""

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from flexlamps.engine.executors.expert_weights import LayerWeights

NAMES = {e: [f"experts.{e}.w"] for e in range(4)}


def test_the_hint_starts_every_read_and_a_read_waits_for_its_own_expert_only():
    gates = {e: threading.Event() for e in NAMES}
    started = []
    pool = ThreadPoolExecutor(max_workers=4)

    def read(e):
        started.append(e)
        gates[e].wait(timeout=10)
        return {f"experts.{e}.w": e}

    def begin(experts, tokens):
        return {e: pool.submit(read, e) for e in experts}

    def load(experts, tokens):
        raise AssertionError("nothing is read synchronously once the hint started it")

    w = LayerWeights({"router": -1}, NAMES, load, begin=begin)
    w.routed_to({3: 1, 1: 2})  # returns at once: the reads wait on their gates
    assert not any(gates[e].is_set() for e in NAMES)
    gates[1].set()
    assert w["experts.1.w"] == 1  # expert 3's read is still held
    assert not gates[3].is_set()
    gates[3].set()
    assert w["experts.3.w"] == 3
    assert sorted(started) == [1, 3] and w["router"] == -1
    pool.shutdown()


def test_an_expert_never_hinted_is_read_when_first_used():
    loaded = []

    def load(experts, tokens):
        loaded.extend(experts)
        return {f"experts.{e}.w": e for e in experts}

    def begin(experts, tokens):
        done = {}
        for e in experts:
            done[e] = Future()
            done[e].set_result({f"experts.{e}.w": e})
        return done

    w = LayerWeights({}, NAMES, load, begin=begin)
    w.routed_to({0: 1})
    assert w["experts.0.w"] == 0 and loaded == []
    assert w["experts.2.w"] == 2 and loaded == [2]  # no hint: read now
    w.routed_to({0: 1, 2: 1})  # already here: nothing started again
    assert loaded == [2]


def test_a_failed_read_is_raised_where_its_expert_is_used():
    def begin(experts, tokens):
        out = {}
        for e in experts:
            out[e] = Future()
            if e == 2:
                out[e].set_exception(OSError("disk gone"))
            else:
                out[e].set_result({f"experts.{e}.w": e})
        return out

    w = LayerWeights({}, NAMES, lambda experts, tokens: {}, begin=begin)
    w.routed_to({1: 1, 2: 1})
    assert w["experts.1.w"] == 1
    try:
        w["experts.2.w"]
    except OSError as e:
        assert "disk gone" in str(e)
    else:
        raise AssertionError("the read's error was swallowed")


def test_an_expert_given_back_while_its_read_is_in_flight_is_waited_for_first():
    """Streaming in groups (`group`): an expert given back before its read landed is given back
    once it has, so its staged bytes are never left behind."""
    gate, evicted = threading.Event(), []
    pool = ThreadPoolExecutor(max_workers=2)

    def read(e):
        gate.wait(timeout=10)
        return {f"experts.{e}.w": e}

    def begin(experts, tokens):
        return {e: pool.submit(read, e) for e in experts}

    def evict(e):
        evicted.append((e, gate.is_set()))

    w = LayerWeights({}, NAMES, lambda experts, tokens: {}, begin=begin, group=1, evict=evict)
    w.routed_to({1: 1, 2: 1})
    assert w._groups.held == [1] and w._groups.queue == [2]
    threading.Timer(0.2, gate.set).start()
    w._groups.pump(first=2)  # the forward waits on 2: 1, still being read, makes room
    assert evicted == [(1, True)] and w["experts.2.w"] == 2
    pool.shutdown()


def test_in_place_experts_are_handed_over_once_a_store_where_they_are_multiplied_as_stored():
    """A cpu-tier expert computed in place is its resident tensors every step: later layers' loads
    (sharing `as_stored`) take them without converting again; a converted (wrapped) one is converted anew."""
    import types

    import torch

    from flexlamps.engine.executors.expert_weights import ExpertCache, RoutedExpertLoads
    from offload import TierBudget

    tensors = {"experts.0.w": torch.ones(2)}
    store = types.SimpleNamespace(tier_of=lambda name: "cpu", device=torch.device("cpu"), is_plain=lambda n: True,
                                  resident=lambda names: {n: tensors[n] for n in names})
    for wraps in (False, True):
        calls, as_stored, places = [], {}, {}

        def convert(fetched):
            calls.append(1)
            return ({n: (w.clone() if wraps else w) for n, w in fetched.items()}, 0)

        for _ in range(3):  # three sweeps of layer 0
            loads = RoutedExpertLoads(store, ExpertCache(TierBudget("gpu", 1 << 20), "off"), 0, {0: ["experts.0.w"]}, convert,
                                      in_place_below=10, places=places, as_stored=as_stored)
            got = loads.load([0], {0: 1})
            assert torch.equal(got["experts.0.w"], tensors["experts.0.w"])
        assert len(calls) == (3 if wraps else 1)


def test_experts_at_hand_are_computed_first_while_the_others_are_read():
    """`ready_first`: an expert whose read landed comes first (its room goes to the next read), then
    those here without a read, in the order given; one still being read when nothing is at hand."""
    gates = {e: threading.Event() for e in NAMES}
    pool = ThreadPoolExecutor(max_workers=4)

    def begin(experts, tokens):
        out = {}
        for e in experts:
            if e in (1, 2):  # used where they live: no read
                out[e] = {f"experts.{e}.w": e}
            else:
                out[e] = pool.submit(lambda e=e: gates[e].wait(timeout=10) and {f"experts.{e}.w": e})
        return out

    w = LayerWeights({}, NAMES, lambda experts, tokens: {}, begin=begin)
    w.routed_to({0: 1, 1: 1, 2: 1, 3: 1})
    order = w.ready_first([0, 1, 2, 3])
    assert next(order) == 1  # here already; 0 and 3 are being read
    gates[3].set()
    w._pending[3].result(timeout=10)
    assert next(order) == 3  # landed: before 2, which is here without a read
    assert next(order) == 2
    assert next(order) == 0  # nothing else left: waited for
    gates[0].set()
    assert w["experts.0.w"] == 0 and list(order) == []
    pool.shutdown()


def test_an_evicted_experts_read_is_let_go_before_the_layer_ends():
    """`evict` gives an expert's staged bytes back mid-layer; its weights must go with them, not stay
    alive in the read's Future until `finish` (a prompt layer's every disk expert held at once:
    ~530 MiB beyond the charges in the MoE job's worker)."""
    import gc
    import types
    import weakref

    import torch

    from flexlamps.engine.executors.expert_weights import ExpertCache, RoutedExpertLoads
    from offload import TierBudget

    pool, released, made = ThreadPoolExecutor(1), [], []

    def fetch(names):
        made.append({n: torch.ones(256) for n in names})
        return made[-1], 1024

    store = types.SimpleNamespace(tier_of=lambda name: "disk", device=torch.device("cpu"), is_plain=lambda n: True,
                                  fetch=fetch, submit=pool.submit, release=released.append)
    loads = RoutedExpertLoads(store, ExpertCache(TierBudget("gpu", 1 << 20), "off"), 0,
                              {0: ["experts.0.w"], 1: ["experts.1.w"]}, lambda fetched: (dict(fetched), 0))
    futures = loads.begin([0, 1], {0: 1, 1: 1})
    gone = [weakref.ref(futures[e].result()["experts.%d.w" % e]) for e in (0, 1)]
    del futures
    made.clear()
    loads.evict(0)
    gc.collect()
    assert gone[0]() is None and gone[1]() is not None  # expert 1 is still the layer's
    loads.finish()
    gc.collect()
    assert gone[1]() is None and released == [1024, 1024]
    pool.shutdown()


def test_a_closed_layers_weights_are_freed_without_the_cyclic_collector():
    """LayerWeights is a reference cycle (its groups call back into it); `close` lets go of the
    experts it read, so they are freed when the sweep drops them, not at some later collection."""
    import gc
    import weakref

    import torch

    pool = ThreadPoolExecutor(max_workers=2)
    made = {}

    def begin(experts, tokens):
        made.update({e: torch.ones(256) for e in experts})
        return {e: pool.submit(lambda e=e: {f"experts.{e}.w": made[e]}) for e in experts}

    w = LayerWeights({}, NAMES, None, begin=begin, group=1, holds=lambda e, tokens: True, evict=lambda e: None)
    w.routed_to({1: 1, 2: 1})
    assert torch.equal(w["experts.1.w"], w["experts.2.w"])
    gone = [weakref.ref(t) for t in made.values()]
    made.clear()
    gc.disable()
    try:
        w.close()
        del w
        assert all(ref() is None for ref in gone)
    finally:
        gc.enable()
    pool.shutdown()
