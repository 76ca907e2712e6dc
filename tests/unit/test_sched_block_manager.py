import pytest

from flexlamps.sched.block_manager import BlockManager, OutOfBlocks, blocks_for


def test_grow_free_and_capacity():
    bm = BlockManager(num_gpu_blocks=4, num_cpu_blocks=2, block_size=16)
    assert blocks_for(17, 16) == 2 and blocks_for(16, 16) == 1 and blocks_for(0, 16) == 0
    assert len(bm.grow("a", 17)) == 2
    assert bm.grow("a", 32) == []  # already large enough
    assert bm.free_gpu_blocks == 2
    with pytest.raises(OutOfBlocks):
        bm.grow("b", 16 * 3)
    assert bm.num_gpu_blocks_of("b") == 0  # a failed grow takes nothing
    bm.free("a")
    assert bm.free_gpu_blocks == 4


def test_swap_out_and_in_move_blocks_between_tiers():
    bm = BlockManager(num_gpu_blocks=4, num_cpu_blocks=2, block_size=16)
    bm.grow("a", 20)
    copies = bm.swap_out("a")
    assert len(copies) == 2 and bm.used_gpu_blocks == 0 and bm.used_cpu_blocks == 2
    bm.grow("b", 64)  # the gpu is free again for others
    assert not bm.can_swap_in("a")
    with pytest.raises(OutOfBlocks):
        bm.swap_in("a")
    assert bm.num_cpu_blocks_of("a") == 2  # a failed swap-in keeps the cpu copy
    bm.free("b")
    back = bm.swap_in("a")
    assert [c for c, _ in back] == [c for _, c in copies]
    assert bm.num_cpu_blocks_of("a") == 0 and bm.num_gpu_blocks_of("a") == 2
    # the cpu blocks are read by the swap-in copy: no swap-out may take them before it is done
    assert bm.used_cpu_blocks == 2 and bm.cpu_blocks_being_read == 2
    bm.grow("c", 32)
    assert not bm.can_swap_out("c")
    bm.copies_done()
    assert bm.used_cpu_blocks == 0 and bm.can_swap_out("c")


def test_swap_out_refused_without_cpu_room():
    bm = BlockManager(num_gpu_blocks=8, num_cpu_blocks=1, block_size=4)
    bm.grow("a", 8)
    assert not bm.can_swap_out("a")
    with pytest.raises(OutOfBlocks):
        bm.swap_out("a")
    assert bm.num_gpu_blocks_of("a") == 2


def test_bad_sizes_name_the_fix():
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        BlockManager(0, 1, 16)
