"""Family plugins: one module a model family, each registering ``family/<model_type>``.

``_base`` holds the decoder machinery the families share (not a plugin): a
layer kind is described in ``spec.extra["kinds"]`` by its attention mechanism
and its MLP, and the layer's parameters are composed from the registered
formula slots.
"""
