"""Family plugins: one module a model family, each registering ``family/<model_type>``.

``_base`` holds the decoder machinery the families share (not a plugin): each
layer kind is described by a :class:`~ndcost.layer.LayerKind` (its attention
mechanism, its MLP and what changes their cost), and the layer's parameters are
composed from the registered formula slots.
"""
