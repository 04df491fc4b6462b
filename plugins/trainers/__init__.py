"""Trainer configuration formats (``trainer/<kind>``): torchtitan, Megatron-LM, DeepSpeed, HyperParallel.

Each module is its own entry point and registers one format meeting the
``trainer/`` contract (ndcost.protocols.TrainerFormatLike); the core's
:mod:`ndcost.trainers` reads and writes through the registry only.
"""
