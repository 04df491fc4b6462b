"""Trainers' configuration files in ndcost's terms: :func:`from_config`, ``estimate --from``, ``search --emit``.

A trainer format is a plugin registered as ``trainer/<kind>`` (torchtitan,
Megatron-LM, DeepSpeed and HyperParallel are built in, plugins/trainers/), so a
third party adds a trainer as it adds a family. Its reader keeps the trainer's
semantics (which mesh FSDP shards over, the defaults the trainer applies, what
its "local batch" counts) and says which of the file's fields it read, which
it ignored, and which trainer defaults it applied; a field it cannot price is
refused by name. Its writer puts a strategy in the trainer's form, and reading
that back gives the same strategy.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Optional, Tuple

import attrs

from ndcost.errors import InvalidValue, UnknownKey
from ndcost.values import Strategy

__all__ = ["TrainerConfig", "from_config", "to_config", "parse_source", "trainer_format", "field_error"]


@attrs.frozen(kw_only=True)
class TrainerConfig:
    """What one trainer configuration file says, in ndcost's terms.

    ``model`` is what the file names, in a form :func:`ndcost.models.load_model` reads (a spec name from
    specs/models, a config path, or a Transformers config mapping), or None where the file names none
    (DeepSpeed's). ``devices`` is the world size the file implies or was given; ``global_batch`` the sequences
    a step consumes over every data-parallel rank. The lists use the trainer's own names for its fields
    (``[parallelism] tensor_parallel_degree``, ``--tensor-model-parallel-size``).
    """

    kind: str
    path: str
    strategy: Strategy
    model: Any = None
    runtime: Optional[str] = None
    devices: Optional[int] = None
    global_batch: Optional[int] = None
    read_fields: Tuple[str, ...] = ()
    ignored_fields: Tuple[str, ...] = ()
    defaults: Tuple[str, ...] = ()   # trainer defaults applied: "loss parallel on with tp > 1 (torchtitan)"
    overrides: Tuple[str, ...] = ()  # strategy fields given beside the file: "seq=8192 (file: 4096)"

    def to_dict(self) -> dict:
        """The JSON form (``estimate --json``'s ``trainer``), the strategy as its string."""
        model = self.model if isinstance(self.model, (str, type(None))) else "from the file"
        return {"kind": self.kind, "path": self.path, "strategy": str(self.strategy), "model": model,
                "runtime": self.runtime, "devices": self.devices, "global_batch": self.global_batch,
                "read": list(self.read_fields), "ignored": list(self.ignored_fields),
                "defaults": list(self.defaults), "overrides": list(self.overrides)}

    def report(self) -> str:
        """What the reader did, for stderr: the fields read and ignored, the defaults and overrides applied."""
        lines = [f"{self.kind} {self.path}: read {', '.join(self.read_fields) or 'nothing'}"]
        if self.ignored_fields:
            lines.append(f"  ignored (no bearing on the cost): {', '.join(self.ignored_fields)}")
        for default in self.defaults:
            lines.append(f"  {self.kind} default: {default}")
        for override in self.overrides:
            lines.append(f"  override: {override}")
        lines.append(f"  strategy: {self.strategy}")
        return "\n".join(lines)


def field_error(kind: str, path: str, field: str, problem: str, fix: str) -> InvalidValue:
    """The one-line refusal of a configuration file's field: the file, the field, what is wrong, the fix."""
    return InvalidValue(f"{kind} config {path}: {field}: {problem}; {fix}")


def trainer_format(kind: str) -> Any:
    """The ``trainer/<kind>`` plugin; an unknown kind is refused naming the registered ones."""
    from ndcost import manager

    registry = manager.registry()
    try:
        return registry.get(f"trainer/{kind}")
    except UnknownKey:
        known = ", ".join(registry.names("trainer")) or "none"
        raise InvalidValue(f"unknown trainer kind {kind!r}; known: {known} (a plugin can register more as "
                           f"'trainer/<kind>')") from None


def parse_source(text: str) -> Tuple[str, str]:
    """``"KIND:PATH"`` (``--from``) as (kind, path), each checked."""
    kind, sep, path = str(text).partition(":")
    if not sep or not kind or not path:
        raise InvalidValue(f"--from {text!r}: expected KIND:PATH, e.g. torchtitan:llama3_8b.toml")
    return kind.strip().lower(), path


def from_config(kind: str, path: Any, *, devices: Optional[int] = None, model: Any = None,
                strategy: Any = None) -> TrainerConfig:
    """Read *path* as a *kind* trainer's configuration (``"torchtitan"``, ``"megatron"``, ``"deepspeed"``,
    ``"hyperparallel"``).

    *devices* gives the world size where the file does not imply it (Megatron's and DeepSpeed's come from the
    launcher) and resolves torchtitan's ``-1`` degree; *model* names the model where the file does not (or
    replaces the one it names; a reader whose ``read`` takes ``model`` derives from it); *strategy*
    (``"seq=8192"`` or a mapping) adds or overrides strategy fields, each override listed in ``overrides``.
    ``ndcost.resolve(config.model).evaluate(config.strategy)`` prices it.
    """
    reader = trainer_format(kind)
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidValue(f"{kind} config {path}: no such file; give the path of a {kind} configuration")
    if devices is not None:
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise InvalidValue(f"devices={devices!r}: expected a positive integer (the world size)")
    # a reader whose read() takes ``model`` counts the layers of the model given beside the file (torchtitan's
    # pipeline split and every-N-th-layer checkpointing depend on them)
    takes_model = "model" in inspect.signature(reader.read).parameters
    config = reader.read(path, devices=devices, **({"model": model} if takes_model else {}))
    if model is not None:
        config = attrs.evolve(config, model=model)
    if config.model is None:
        raise InvalidValue(f"{kind} config {path} names no model; give one (ndcost estimate MODEL --from "
                           f"{kind}:{path}, or from_config(..., model=...))")
    if strategy:
        config = _with_overrides(config, strategy)
    return config


def to_config(kind: str, strategy: Any, *, model: Any = None, global_batch: Optional[int] = None) -> str:
    """*strategy* in the *kind* trainer's form (``search --emit``); its reader reads back the same strategy."""
    writer = trainer_format(kind)
    if not writer.writes:
        raise InvalidValue(f"trainer kind {kind!r} reads configurations but does not write them")
    if not isinstance(strategy, Strategy):
        strategy = Strategy.parse(strategy) if isinstance(strategy, str) else Strategy.from_mapping(strategy)
    return writer.write(strategy, model=model, global_batch=global_batch)


def _with_overrides(config: TrainerConfig, strategy: Any) -> TrainerConfig:
    given = Strategy.named_fields(strategy)  # a field given at its default is an override too
    current = config.strategy.to_dict()
    merged = {**config.strategy.to_dict(defaults=False), **given}
    new = Strategy.from_mapping(merged)
    if config.devices is not None and new.devices != config.devices:
        raise InvalidValue(f"{config.kind} config {config.path}: the strategy given beside it "
                           f"({', '.join(f'{k}={_text(v)}' for k, v in given.items())}) makes it span {new.devices} "
                           f"devices (dp * fsdp * cp * tp * pp), not the --devices {config.devices} it was read "
                           f"for; give --devices {new.devices}, or fields whose product stays {config.devices}")
    notes = []
    for key in given:
        before, after = current.get(key), new.to_dict()[key]
        if before != after:
            notes.append(f"{key}={_text(after)} (file: {_text(before)})")
    return attrs.evolve(config, strategy=new, overrides=config.overrides + tuple(notes))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "unset" if value is None else str(value)
