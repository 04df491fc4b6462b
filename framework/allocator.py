"""PyTorch's CUDA caching allocator, simulated: the bytes it reserves for a sequence of allocations and frees.

Every rule here follows ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch at commit
001074d25084fdb87a799823e395a50f5ec044d3), cited by function name, and ``docs/source/notes/cuda.rst``
("Memory management", ``PYTORCH_CUDA_ALLOC_CONF``):

- ``round_size``: a request is rounded up to a multiple of 512 bytes (``kMinBlockSize``), or to the
  next power-of-two division under ``roundup_power2_divisions``;
- ``get_pool``: rounded sizes up to 1 MiB (``kSmallSize``) come from the small pool, larger from the large;
- ``get_allocation_size``: a new segment is 2 MiB (``kSmallBuffer``) for the small pool, 20 MiB
  (``kLargeBuffer``) for requests under 10 MiB (``kMinLargeAlloc``), else the request rounded up to
  2 MiB (``kRoundLarge``);
- ``get_free_block``: the smallest cached free block of the pool at least as large (best fit, ties by
  address); under ``max_split_size`` a request below it takes no block at or above it, and one at or
  above it takes no block 20 MiB or more larger than itself;
- ``should_split`` / ``alloc_found_block``: the block is split when the remainder is at least 512 bytes
  (small pool, expandable segments) or more than 1 MiB (large pool; never for a request at or above
  ``max_split_size``); the request takes the front;
- ``free_block`` / ``try_merge_blocks``: a freed block merges with its free neighbours and stays
  cached: reserved bytes never fall on a free;
- ``expandable_segments:True`` (``try_allocate_expandable_block``, ``find_expandable_block``,
  ``map_block``): one segment a pool (and stream) whose mapped end grows in pages of 2 MiB (small pool)
  or 20 MiB (large pool); a request that no cached block fits maps pages at the end, merged with a free
  block there; best fit skips a block whose unmapped tail makes it look larger (``get_free_block``).

Stats as ``DeviceStats`` keeps them (``alloc_found_block``, ``free``, ``alloc_block``, ``map_block``):
allocated bytes are the blocks handed out (a block not split is counted whole), requested bytes the
sizes asked for, reserved bytes the segments (or mapped pages) held.

What it leaves out: device capacity, so nothing is released back (``release_cached_blocks``,
``release_available_cached_blocks`` and ``garbage_collection_threshold``, which acts only under a
memory fraction, run only when cudaMalloc fails or a limit is near; ``torch.cuda.empty_cache``);
streams (one stream: cross-stream uses, events and per-stream pools are not modelled); CUDA graph
private pools; where cudaMalloc places segments (they are given increasing addresses, which only
breaks ties between cached blocks of equal size); memory outside the allocator (the CUDA context,
cuBLAS workspaces, NCCL buffers).
"""
from __future__ import annotations

import bisect
from typing import Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost.errors import InvalidValue

MIB = 1 << 20
MIN_BLOCK_BYTES = 512          # kMinBlockSize
SMALL_REQUEST_BYTES = MIB      # kSmallSize: the largest request of the small pool
SMALL_SEGMENT_BYTES = 2 * MIB  # kSmallBuffer
LARGE_SEGMENT_BYTES = 20 * MIB  # kLargeBuffer
MIN_LARGE_ALLOC_BYTES = 10 * MIB  # kMinLargeAlloc: requests below it share 20 MiB segments
ROUND_LARGE_BYTES = 2 * MIB    # kRoundLarge
# the address space apart between two segments (and the size of an expandable segment's reservation)
_ADDRESS_STRIDE = 1 << 50


@attrs.frozen(kw_only=True)
class AllocatorConfig:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` options that change what is reserved.

    ``max_split_size_bytes`` None is PyTorch's default (no limit: every block may be split);
    ``roundup_power2_divisions`` 0 or 1 is off (sizes rounded to 512 bytes).
    """

    expandable_segments: bool = False
    max_split_size_bytes: Optional[int] = None
    roundup_power2_divisions: int = 0

    def __attrs_post_init__(self) -> None:
        limit = self.max_split_size_bytes
        # parseMaxSplitSize refuses a limit below kLargeBuffer (c10/core/AllocatorConfig.cpp; older releases'
        # CUDAAllocatorConfig.cpp refused 20 MiB itself)
        if limit is not None and (not isinstance(limit, int) or limit < LARGE_SEGMENT_BYTES):
            raise InvalidValue(f"max_split_size_bytes={limit!r}: PyTorch refuses a max_split_size_mb below 20 "
                               f"(MiB); give {LARGE_SEGMENT_BYTES} bytes or more, or None for no limit")
        divisions = self.roundup_power2_divisions
        if not isinstance(divisions, int) or divisions < 0 or (divisions > 1 and divisions & (divisions - 1)):
            raise InvalidValue(f"roundup_power2_divisions={divisions!r}: PyTorch takes a power of two (or 0 for "
                               f"off)")

    @property
    def split_limit_bytes(self) -> int:
        """``max_split_size`` as the allocator compares it (SIZE_MAX where unset)."""
        return (1 << 64) - 1 if self.max_split_size_bytes is None else self.max_split_size_bytes

    @classmethod
    def parse(cls, text: str) -> "AllocatorConfig":
        """From a ``PYTORCH_CUDA_ALLOC_CONF`` string, e.g. ``"expandable_segments:True,max_split_size_mb:128"``."""
        values: Dict[str, object] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, value = item.partition(":")
            if name == "expandable_segments" and value in ("True", "False"):
                values["expandable_segments"] = value == "True"
            elif name == "max_split_size_mb" and value.isdigit():
                values["max_split_size_bytes"] = int(value) * MIB
            elif name == "roundup_power2_divisions" and value.isdigit():
                values["roundup_power2_divisions"] = int(value)
            else:
                raise InvalidValue(f"PYTORCH_CUDA_ALLOC_CONF item {item!r}: the simulation takes expandable_segments:"
                                   f"True|False, max_split_size_mb:<MiB> and roundup_power2_divisions:<n>")
        return cls(**values)  # type: ignore[arg-type]


DEFAULT_CONFIG = AllocatorConfig()  # PyTorch's defaults: no PYTORCH_CUDA_ALLOC_CONF


def round_size(nbytes: int, config: AllocatorConfig = DEFAULT_CONFIG) -> int:
    """The block size a request of *nbytes* asks the pool for (``round_size``, ``roundup_power2_next_division``)."""
    if nbytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    divisions = config.roundup_power2_divisions
    if divisions > 1 and nbytes > MIN_BLOCK_BYTES * divisions:
        if nbytes & (nbytes - 1) == 0:
            return nbytes
        floor = 1 << (nbytes.bit_length() - 1)
        step = floor // divisions
        return nbytes if nbytes % step == 0 else (nbytes // step + 1) * step
    return -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_bytes(rounded: int) -> int:
    """The segment cudaMalloc is asked for where no cached block fits a *rounded* request (``get_allocation_size``)."""
    if rounded <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if rounded < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return -(-rounded // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def large_block_bytes(nbytes):
    """What one tensor of *nbytes* (an int or a numpy array) above 10 MiB reserves alone: a 2 MiB multiple.

    For the composition's persistent tensors (parameters, gradients, optimizer states), each reserved as
    its own segment; the same rule as :func:`segment_bytes` for requests of 10 MiB and more.
    """
    return nbytes + large_block_excess_bytes(nbytes)


def large_block_excess_bytes(nbytes):
    """What the block of :func:`large_block_bytes` reserves beyond the tensor's *nbytes* (integers): up to the
    next multiple of 2 MiB, ``-nbytes`` modulo 2 MiB (one operation: the memory composition takes it of a batch)."""
    return -nbytes % ROUND_LARGE_BYTES


def packed_reserved_bytes(count, nbytes):
    """What *count* live tensors of *nbytes* each (ints or numpy arrays) reserve, allocated one after another.

    The same rules as :class:`CachingAllocator` on a fresh allocator, in closed form for the composition's
    arrays: a segment (``get_allocation_size``) holds ``segment // round_size`` of them, the last taking
    what is left whole where splitting is refused (``should_split``); a request of 10 MiB or more is a
    segment of its own. Power-of-two rounding (``roundup_power2_divisions``) is not used here.
    """
    rounded = np.maximum(-(-np.asarray(nbytes, dtype=np.int64) // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES,
                         MIN_BLOCK_BYTES)
    segment = np.where(rounded <= SMALL_REQUEST_BYTES, SMALL_SEGMENT_BYTES,
                       np.where(rounded < MIN_LARGE_ALLOC_BYTES, LARGE_SEGMENT_BYTES, large_block_bytes(rounded)))
    per_segment = np.where(rounded < MIN_LARGE_ALLOC_BYTES, segment // rounded, 1)
    return -(-np.asarray(count, dtype=np.int64) // per_segment) * segment


@attrs.define(eq=False)
class _Block:
    address: int
    size: int
    small: bool
    expandable: bool = False
    allocated: bool = False
    mapped: bool = True
    requested: int = 0
    prev: Optional["_Block"] = None
    next: Optional["_Block"] = None


@attrs.frozen(kw_only=True)
class AllocatorStats:
    """What ``torch.cuda.memory_stats`` would report after a replay (``.current`` and ``.peak`` of each)."""

    reserved_bytes: int
    allocated_bytes: int
    requested_bytes: int
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    peak_requested_bytes: int
    segments: int  # cudaMalloc calls, or page mappings under expandable segments


class CachingAllocator:
    """One device's caching allocator on one stream: :meth:`malloc` and :meth:`free` by the caller's key."""

    def __init__(self, config: AllocatorConfig = DEFAULT_CONFIG) -> None:
        self.config = config
        # each pool's cached free blocks, sorted as BlockComparatorSize orders them: (size, address)
        self._free: Dict[bool, List[Tuple[int, int]]] = {True: [], False: []}
        self._blocks: Dict[int, _Block] = {}   # free mapped blocks by address
        self._tails: Dict[bool, _Block] = {}   # an expandable segment's unmapped end, per pool
        self._live: Dict[Hashable, _Block] = {}
        self._next_address = _ADDRESS_STRIDE
        self.reserved = self.allocated = self.requested = 0
        self.peak_reserved = self.peak_allocated = self.peak_requested = 0
        self.segments = 0

    # -- the pool's sorted set --------------------------------------------------------------------
    def _insert(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.address))
        self._blocks[block.address] = block

    def _erase(self, block: _Block) -> None:
        entries = self._free[block.small]
        del entries[bisect.bisect_left(entries, (block.size, block.address))]
        del self._blocks[block.address]

    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.segments += 1

    # -- malloc -----------------------------------------------------------------------------------
    def _get_free_block(self, size: int, small: bool) -> Optional[_Block]:
        """``get_free_block``: best fit, the expandable tail's walk, the ``max_split_size`` limits."""
        entries = self._free[small]
        i = bisect.bisect_left(entries, (size, -1))
        if i == len(entries):
            return None
        block = self._blocks[entries[i][1]]
        if block.expandable:
            def expandable_size(b: _Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            while i + 1 < len(entries):
                following = self._blocks[entries[i + 1][1]]
                if expandable_size(following) >= expandable_size(block):
                    break
                i, block = i + 1, following
        limit = self.config.split_limit_bytes
        if size < limit <= block.size:
            return None
        if size >= limit and block.size >= size + LARGE_SEGMENT_BYTES:
            return None
        self._erase(block)
        return block

    def _alloc_block(self, size: int, small: bool) -> _Block:
        """``alloc_block``: a new cudaMalloc segment, or pages mapped onto the expandable segment."""
        if self.config.expandable_segments:
            return self._allocate_expandable(size, small)
        nbytes = segment_bytes(size)
        block = _Block(address=self._next_address, size=nbytes, small=small)
        self._next_address += _ADDRESS_STRIDE
        self._reserve(nbytes)
        return block

    def _allocate_expandable(self, size: int, small: bool) -> _Block:
        """``try_allocate_expandable_block``: map pages at the end, merged with a free block before them."""
        page = SMALL_SEGMENT_BYTES if small else LARGE_SEGMENT_BYTES
        tail = self._tails.get(small)
        if tail is None:  # find_expandable_block: a new segment, all of it unmapped
            tail = _Block(address=self._next_address, size=_ADDRESS_STRIDE, small=small, expandable=True, mapped=False)
            self._next_address += 2 * _ADDRESS_STRIDE
            self._tails[small] = tail
        candidate = tail.prev if tail.prev is not None and not tail.prev.allocated else None
        if candidate is not None:
            self._erase(candidate)
            if candidate.size >= size:  # kept out by max_split_size's limits alone: taken as it is
                return candidate
            missing = size - candidate.size
        else:
            missing = size
        mapped = -(-missing // page) * page  # ExpandableSegment::map rounds to whole pages
        new = _Block(address=tail.address, size=mapped, small=small, expandable=True, prev=tail.prev, next=tail)
        if tail.prev is not None:
            tail.prev.next = new
        tail.prev = new
        tail.address += mapped
        tail.size -= mapped
        self._reserve(mapped)
        if candidate is not None:  # try_merge_blocks(new, candidate)
            new.address, new.size, new.prev = candidate.address, candidate.size + new.size, candidate.prev
            if new.prev is not None:
                new.prev.next = new
        return new

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self.config.expandable_segments:
            return remaining >= MIN_BLOCK_BYTES
        return size < self.config.split_limit_bytes and remaining > SMALL_REQUEST_BYTES

    def malloc(self, key: Hashable, nbytes: int) -> None:
        """Allocate *nbytes* for *key* (``DeviceCachingAllocator::malloc``); 0 bytes allocates nothing."""
        if key in self._live:
            raise InvalidValue(f"allocation {key!r} is live already; free it before allocating it again")
        if not isinstance(nbytes, int) or nbytes < 0:
            raise InvalidValue(f"allocation {key!r} of {nbytes!r} bytes: give a whole number of bytes, 0 or more")
        if nbytes == 0:  # NativeCachingAllocator::allocate skips malloc for size 0
            return
        size = round_size(nbytes, self.config)
        small = size <= SMALL_REQUEST_BYTES
        block = self._get_free_block(size, small) or self._alloc_block(size, small)
        if self._should_split(block, size):  # alloc_found_block: the request takes the front
            rest = _Block(address=block.address + size, size=block.size - size, small=small,
                          expandable=block.expandable, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert(rest)
        block.allocated, block.requested = True, nbytes
        self._live[key] = block
        self.allocated += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)

    def free(self, key: Hashable) -> None:
        """Return *key*'s block to its pool, merged with free neighbours (``free_block``, ``try_merge_blocks``)."""
        block = self._live.pop(key, None)
        if block is None:
            raise InvalidValue(f"free of {key!r}, which is not allocated; each free must follow its allocation")
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        for other in (block.prev, block.next):
            if other is None or other.allocated or not other.mapped:
                continue
            self._erase(other)
            if other is block.prev:
                block.address, block.prev = other.address, other.prev
                if block.prev is not None:
                    block.prev.next = block
            else:
                block.next = other.next
                if block.next is not None:
                    block.next.prev = block
            block.size += other.size
        self._insert(block)

    def stats(self) -> AllocatorStats:
        return AllocatorStats(reserved_bytes=self.reserved, allocated_bytes=self.allocated,
                              requested_bytes=self.requested, peak_reserved_bytes=self.peak_reserved,
                              peak_allocated_bytes=self.peak_allocated, peak_requested_bytes=self.peak_requested,
                              segments=self.segments)

    def replay(self, events: Iterable[Tuple[Hashable, int]]) -> AllocatorStats:
        """Apply ``(key, +bytes)`` allocations and ``(key, -bytes)`` frees in order (``LiveBytes.events``)."""
        for key, delta in events:
            if delta > 0:
                self.malloc(key, delta)
            elif delta < 0:
                self.free(key)
        return self.stats()


def replay(events: Iterable[Tuple[Hashable, int]], config: AllocatorConfig = DEFAULT_CONFIG) -> AllocatorStats:
    """The stats after replaying *events* on a fresh allocator under *config*."""
    return CachingAllocator(config).replay(events)


def tagged(events: Iterable[Tuple[Hashable, int]], tag: Hashable) -> List[Tuple[Hashable, int]]:
    """*events* with each key made ``(tag, key)``: the same allocations again as another layer's."""
    return [((tag, key), delta) for key, delta in events]


@attrs.frozen(kw_only=True)
class StackExcess:
    """Reserved bytes above allocated ones of a stack of one layer kind, from one layer's events.

    ``per_layer_bytes``: what each layer's forward adds to reserved beyond what it adds to allocated,
    once the stack is steady (over the second half of :data:`STACK_LAYERS` forwards: the first layers'
    freed temporaries stay cached and later layers' saves fill them);
    ``working_bytes``: the rest of the excess at the stack's peak (the first layer's segments, the last
    layer's backward), so that ``n * per_layer_bytes + working_bytes`` is the replay's peak reserved
    less its peak allocated for ``n`` = ``STACK_LAYERS`` layers.
    """

    per_layer_bytes: float
    working_bytes: float


STACK_LAYERS = 8


def stack_excess(forward: Sequence[Tuple[Hashable, int]], backward: Sequence[Tuple[Hashable, int]],
                 config: AllocatorConfig = DEFAULT_CONFIG, layers: int = STACK_LAYERS) -> StackExcess:
    """Replay *layers* forwards of one layer (each keeps what it saves), then the last one's backward.

    *forward* and *backward* are one layer's events (``LiveBytes.events`` either side of the forward's
    end, the bytes the composition prices apart already left out); each copy's keys are its own.
    """
    if layers < 3:
        raise InvalidValue(f"layers={layers!r}: a steady per-layer figure needs 3 layers or more")
    alloc = CachingAllocator(config)
    marks = []
    for copy in range(layers):
        alloc.replay(tagged(forward, copy))
        marks.append(alloc.reserved - alloc.allocated)
    alloc.replay(tagged(backward, layers - 1))
    half = layers // 2
    per_layer = (marks[-1] - marks[half - 1]) / (layers - half)
    return StackExcess(per_layer_bytes=per_layer,
                       working_bytes=(alloc.peak_reserved - alloc.peak_allocated) - layers * per_layer)


__all__ = ["AllocatorConfig", "AllocatorStats", "CachingAllocator", "StackExcess", "large_block_bytes",
           "large_block_excess_bytes", "packed_reserved_bytes", "replay", "round_size", "segment_bytes", "stack_excess",
           "tagged", "MIB"]
