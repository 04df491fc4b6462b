"""The caching allocator simulation against figures derived by hand from PyTorch's rules.

Each expectation follows the rules of c10/cuda/CUDACachingAllocator.cpp (the functions named in
ndcost.allocator's docstring): round_size (512-byte multiples), get_pool (small: <= 1 MiB),
get_allocation_size (2 MiB small segments; 20 MiB for large requests under 10 MiB; else a 2 MiB
multiple), get_free_block (best fit), should_split (small: remainder >= 512 B; large: > 1 MiB),
free_block (merge with free neighbours, keep cached).
"""
from __future__ import annotations

import numpy as np
import pytest

from ndcost.allocator import (
    MIB,
    AllocatorConfig,
    CachingAllocator,
    large_block_bytes,
    packed_reserved_bytes,
    replay,
    round_size,
    stack_excess,
    tagged,
)
from ndcost.errors import InvalidValue

EXPANDABLE = AllocatorConfig(expandable_segments=True)


def _run(requests, config=None):
    """Events from ('a', n) allocations and ('f', key) frees, keys numbered by allocation."""
    events, sizes = [], {}
    for what, value in requests:
        if what == "a":
            key = len(sizes)
            sizes[key] = value
            events.append((key, value))
        else:
            events.append((value, -sizes[value]))
    return replay(events, config or AllocatorConfig())


def test_one_byte_reserves_a_small_segment():
    # 1 B -> 512 B (kMinBlockSize), small pool, a new 2 MiB segment (kSmallBuffer)
    stats = _run([("a", 1)])
    assert (stats.peak_reserved_bytes, stats.peak_allocated_bytes, stats.peak_requested_bytes) == (2 * MIB, 512, 1)


def test_small_requests_share_a_segment_and_split_at_512_bytes():
    # 1 MiB takes the front of a 2 MiB segment, the 1 MiB remainder (>= 512 B) is split off and
    # serves the second; a third needs a second segment
    stats = _run([("a", MIB), ("a", MIB), ("a", 700)])
    assert stats.peak_reserved_bytes == 4 * MIB
    assert stats.peak_allocated_bytes == 2 * MIB + 1024  # 700 B -> 1024 B


def test_five_4_mib_requests_share_one_20_mib_segment():
    # 4 MiB < 10 MiB: a 20 MiB segment; remainders 16, 12, 8, 4 MiB (> 1 MiB) are split and reused;
    # the fifth takes the last 4 MiB exactly
    stats = _run([("a", 4 * MIB)] * 5)
    assert stats.peak_reserved_bytes == 20 * MIB
    assert stats.peak_allocated_bytes == 20 * MIB
    assert stats.segments == 1
    # a sixth finds no cached block: a second 20 MiB segment
    assert _run([("a", 4 * MIB)] * 6).peak_reserved_bytes == 40 * MIB


def test_25_mib_reserves_26_and_the_unsplit_block_counts_whole():
    # 25 MiB >= 10 MiB: rounded up to 26 MiB (kRoundLarge); the 1 MiB remainder is not > 1 MiB,
    # so the block is not split and allocated counts all 26 MiB
    stats = _run([("a", 25 * MIB)])
    assert (stats.peak_reserved_bytes, stats.peak_allocated_bytes, stats.peak_requested_bytes) == (
        26 * MIB, 26 * MIB, 25 * MIB)


def test_a_freed_8_mib_block_is_split_for_6_mib_and_its_remainder_reused():
    # 4 + 8 + 8 MiB fill one 20 MiB segment; freeing the middle 8 MiB leaves it cached between two
    # live blocks (no merge); 6 MiB takes it by best fit and splits off 2 MiB (> 1 MiB), which a
    # 2 MiB request (large pool: > 1 MiB) then takes exactly
    stats = _run([("a", 4 * MIB), ("a", 8 * MIB), ("a", 8 * MIB), ("f", 1), ("a", 6 * MIB), ("a", 2 * MIB)])
    assert stats.peak_reserved_bytes == 20 * MIB
    assert stats.allocated_bytes == 20 * MIB
    assert stats.peak_requested_bytes == 20 * MIB


def test_best_fit_takes_the_smallest_cached_block():
    # two segments: 12 MiB and 16 MiB (each its own 2 MiB multiple), both freed; 11 MiB takes the
    # 12 MiB block (remainder 1 MiB: not split), so allocated counts 12 MiB
    stats = _run([("a", 12 * MIB), ("a", 16 * MIB), ("f", 0), ("f", 1), ("a", 11 * MIB)])
    assert stats.reserved_bytes == 28 * MIB
    assert stats.allocated_bytes == 12 * MIB


def test_freed_neighbours_coalesce():
    # 4 + 4 MiB and the 12 MiB remainder of one segment; both freed merge into one 20 MiB block, which
    # an 18 MiB request (its own 18 MiB multiple of 2 MiB) takes, splitting off 2 MiB: no new segment
    stats = _run([("a", 4 * MIB), ("a", 4 * MIB), ("f", 0), ("f", 1), ("a", 18 * MIB)])
    assert stats.peak_reserved_bytes == 20 * MIB
    assert stats.allocated_bytes == 18 * MIB


def test_frees_keep_the_memory_cached():
    stats = _run([("a", 30 * MIB), ("f", 0)])
    assert (stats.reserved_bytes, stats.allocated_bytes, stats.requested_bytes) == (30 * MIB, 0, 0)


GROWING = [("a", 12 * MIB), ("f", 0), ("a", 14 * MIB), ("f", 1), ("a", 16 * MIB), ("f", 2), ("a", 18 * MIB),
           ("f", 3)]


def test_growing_sizes_fragment_the_default_and_not_expandable_segments():
    # default: each request (>= 10 MiB) finds every cached block too small and cudaMallocs its own
    # segment: 12 + 14 + 16 + 18 = 60 MiB reserved for at most 18 MiB allocated
    default = _run(GROWING)
    assert default.peak_reserved_bytes == 60 * MIB
    assert default.peak_allocated_bytes == 18 * MIB
    # expandable: one 20 MiB page of the large pool is mapped; each freed block merges back into it
    # and the next request is split from it (remainder >= 512 B)
    expandable = _run(GROWING, EXPANDABLE)
    assert expandable.peak_reserved_bytes == 20 * MIB
    assert expandable.peak_allocated_bytes == 18 * MIB
    # 22 MiB: the free 20 MiB block at the mapped end is grown by one more 20 MiB page
    assert _run(GROWING + [("a", 22 * MIB)], EXPANDABLE).peak_reserved_bytes == 40 * MIB


def test_expandable_small_pool_grows_in_2_mib_pages():
    # 1 MiB + 1 MiB + 512 KiB: the small pool's segment maps 2 MiB, then one more 2 MiB page
    stats = _run([("a", MIB), ("a", MIB), ("a", 512 * 1024)], EXPANDABLE)
    assert stats.peak_reserved_bytes == 4 * MIB
    assert stats.peak_allocated_bytes == 2 * MIB + 512 * 1024


def test_expandable_best_fit_prefers_a_block_away_from_the_mapped_end():
    # one 20 MiB page: A 6 MiB, B 6 MiB, C 6 MiB, then 2 MiB free at the end (next to the unmapped tail).
    # Free A: 6 MiB cached at the front. 2 MiB: best fit by size is the 2 MiB end block, but its
    # expandable size (2 MiB + the unmapped tail) is larger than A's, so A is taken and split
    alloc = CachingAllocator(EXPANDABLE)
    for key in "ABC":
        alloc.malloc(key, 6 * MIB)
    alloc.free("A")
    alloc.malloc("D", 2 * MIB)
    alloc.malloc("E", 6 * MIB)  # the 4 MiB left of A's is too small: the end block (2 MiB) grows by a page
    assert alloc.stats().peak_reserved_bytes == 40 * MIB


def test_max_split_size_keeps_oversize_blocks_whole():
    limit = AllocatorConfig(max_split_size_bytes=32 * MIB)
    # a cached 40 MiB block (>= 32 MiB) is not handed to an 8 MiB request: a new 20 MiB segment
    assert _run([("a", 40 * MIB), ("f", 0), ("a", 8 * MIB)], limit).peak_reserved_bytes == 60 * MIB
    assert _run([("a", 40 * MIB), ("f", 0), ("a", 8 * MIB)]).peak_reserved_bytes == 40 * MIB
    # an oversize request takes an oversize block less than 20 MiB larger, whole (not split) ...
    taken = _run([("a", 60 * MIB), ("f", 0), ("a", 42 * MIB)], limit)
    assert (taken.peak_reserved_bytes, taken.allocated_bytes) == (60 * MIB, 60 * MIB)
    # ... and not one 20 MiB or more larger: a 36 MiB segment of its own
    assert _run([("a", 60 * MIB), ("f", 0), ("a", 36 * MIB)], limit).peak_reserved_bytes == 96 * MIB


def test_round_size():
    assert [round_size(n) for n in (0, 1, 512, 513, 3 * MIB + 1)] == [512, 512, 512, 1024, 3 * MIB + 512]
    four = AllocatorConfig(roundup_power2_divisions=4)
    # at or below 512 * 4 bytes the 512-byte rule holds; above, the next quarter between powers of two:
    # 12,000 lies in [8192, 16384), quarters of 2048 -> 12,288; 4 MiB + 1 -> 5 MiB
    assert [round_size(n, four) for n in (1200, 12_000, 4 * MIB + 1, 4 * MIB)] == [1536, 12_288, 5 * MIB, 4 * MIB]


def test_large_block_bytes():
    assert [large_block_bytes(n) for n in (1, 2 * MIB, 2 * MIB + 1)] == [2 * MIB, 2 * MIB, 4 * MIB]
    # the composition's arrays (int64): the same blocks, and 0 bytes reserve none
    sizes = np.array([0, 1, 2 * MIB, 2 * MIB + 1, 3 * MIB - 512], dtype=np.int64)
    assert large_block_bytes(sizes).tolist() == [0, 2 * MIB, 2 * MIB, 4 * MIB, 4 * MIB]


def test_parse_alloc_conf():
    config = AllocatorConfig.parse("expandable_segments:True,max_split_size_mb:128")
    assert config == AllocatorConfig(expandable_segments=True, max_split_size_bytes=128 * MIB)


@pytest.mark.parametrize("text", ["expandable_segments:yes", "max_split_size_mb:19", "roundup_power2_divisions:3",
                                  "garbage_collection_threshold:0.6"])
def test_bad_alloc_conf_is_refused(text):
    with pytest.raises(InvalidValue):
        AllocatorConfig.parse(text)


def test_bad_events_are_refused():
    with pytest.raises(InvalidValue, match="not allocated"):
        replay([("x", -512)])
    with pytest.raises(InvalidValue, match="live already"):
        replay([("x", 512), ("x", 512)])


def test_zero_byte_storages_allocate_nothing():
    assert replay([("x", 0)]).peak_reserved_bytes == 0


@pytest.mark.parametrize("nbytes", [1, 700, 300_000, MIB, MIB + 1, 3 * MIB, 7 * MIB + 512, 10 * MIB, 10 * MIB + 3,
                                    33 * MIB])
@pytest.mark.parametrize("count", [1, 3, 7, 16])
def test_packed_reserved_bytes_is_the_simulation_in_closed_form(count, nbytes):
    assert int(packed_reserved_bytes(count, nbytes)) == _run([("a", nbytes)] * count).reserved_bytes


def test_packed_reserved_bytes_by_hand():
    # 7 MiB: two to a 20 MiB segment (the second is split from the 13 MiB left, leaving 6 MiB cached,
    # too small for a third): 3 tensors need 2 segments; 4 MiB: five to a segment
    assert int(packed_reserved_bytes(3, 7 * MIB)) == 40 * MIB
    assert int(packed_reserved_bytes(6, 4 * MIB)) == 40 * MIB


def test_stack_excess_by_hand():
    # one layer: a 4 MiB temporary freed in the forward, a 4 MiB save kept to the backward, which
    # allocates and frees 4 MiB. Layer 1's forward cudaMallocs one 20 MiB segment (excess 16 MiB),
    # its temporary's block is reused by its save; layers 2 to 5 fill the segment (the fifth takes the
    # last 4 MiB whole), layer 6 opens a second segment. Reserved less allocated after each of the 8
    # forwards: 16, 12, 8, 4, 0, 16, 12, 8 MiB; the second half's steady figure
    # (8 - 4) / 4 = +1 MiB a layer; the peak excess is at the backward's 4 MiB: 8 - 4 = 4 MiB, so
    # working = 4 - 8 * 1 = -4 MiB
    forward = [("t", 4 * MIB), ("t", -4 * MIB), ("s", 4 * MIB)]
    backward = [("g", 4 * MIB), ("g", -4 * MIB), ("s", -4 * MIB)]
    excess = stack_excess(forward, backward)
    assert excess.per_layer_bytes == MIB
    alloc = CachingAllocator()
    for copy in range(8):
        alloc.replay(tagged(forward, copy))
    alloc.replay(tagged(backward, 7))
    assert alloc.peak_reserved - alloc.peak_allocated == 8 * excess.per_layer_bytes + excess.working_bytes
