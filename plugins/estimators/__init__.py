"""Estimators: what turns a layer kind into a KindRecord (activations) or a KindWork (FLOPs and bytes moved).

Each is a plugin registered as ``estimator/activations/<name>`` or
``estimator/flops/<name>``; the resolver picks per kind from the family's
preference among those registered and available, and says which in the
provenance. A third party replaces one by registering the same key with
``override=True``, or adds one a family of its own prefers.
"""
