"""The composition layer: a batch of strategies (numpy columns) priced in bytes and seconds.

- :mod:`ndcost.compose.placement`: which layers, embedding and head each pipeline rank holds.
- :mod:`ndcost.compose.sharding`: how many ways each category of bytes is split.
- :mod:`ndcost.compose.topology`: which network level a group of ranks spans.
- :mod:`ndcost.compose.memory`: bytes per stage by category, as named steps.
- :mod:`ndcost.compose.time`: step seconds (compute, communication, bubble, optimizer), as named steps.

Nothing here imports torch; the submodules are imported by name (this package imports none of them).
"""
