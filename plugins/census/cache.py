"""The census's disk cache: one JSON file a record, keyed by what decides the measurement.

The key is the content of the layer kind's own config (the whole model's
stack-level fields left out, so a 1-layer and a 60-layer model of the same
widths share an entry), the sequence length, the runtime profile's content,
and the torch and Transformers versions. Computing it imports neither torch
nor Transformers, so a cached resolve stays cheap.

A cache cannot lie: an entry is read only where it is a regular file (a
FIFO or directory under its name is never opened), and used only where its
record meets the schema :func:`store` writes, with finite figures no
measurement could contradict (:func:`check_record`); anything else is
recomputed with a warning. Writes are atomic (a temporary file renamed into
place), so processes filling one cache at once never see half an entry; a
cache that cannot be written warns once and the measured figures are used
uncached.

The directory is ``$NDCOST_CACHE_DIR`` if set, else the user cache directory
(``$XDG_CACHE_HOME/ndcost``, ``~/.cache/ndcost``; ``~/Library/Caches/ndcost``
on macOS; ``%LOCALAPPDATA%\\ndcost`` on Windows).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import sys
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Set

import attrs

from ndcost.records import KindRecord

# Bumped whenever the census's rules change what it measures.
CENSUS_VERSION = 22

# Config fields of the whole model, not of one layer: left out of a layer kind's key.
STACK_FIELDS = frozenset({
    "num_hidden_layers", "vocab_size", "architectures", "_name_or_path", "name_or_path", "transformers_version",
    "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings", "use_cache", "return_dict",
    "output_hidden_states", "output_attentions", "torchscript", "dtype", "torch_dtype", "id2label", "label2id",
    "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "first_k_dense_replace",
    "decoder_sparse_step", "mlp_only_layers", "moe_layer_freq", "full_attention_interval", "max_window_layers",
    "layer_types", "initializer_range", "problem_type", "tokenizer_class", "chunk_size_feed_forward",
    "task_specific_params", "finetuning_task", "prefix", "sep_token_id", "decoder_start_token_id",
    "_attn_implementation_autoset", "_experts_implementation", "_attn_implementation",
})


class CacheWarning(UserWarning):
    """A cache entry could not be used and is being recomputed."""


def cache_dir() -> Path:
    """Where census records live (``$NDCOST_CACHE_DIR`` overrides the user cache directory)."""
    override = os.environ.get("NDCOST_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "ndcost"
    if os.name == "nt":
        return Path(os.environ.get("LOCALAPPDATA", Path.home())) / "ndcost"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ndcost"


def versions() -> Dict[str, str]:
    """The torch and Transformers versions installed, from their metadata (no import)."""
    out = {}
    for name in ("torch", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def kind_config(hf_config: Mapping[str, Any], layer_index: int) -> Dict[str, Any]:
    """The content of one layer kind's config: the stack-level fields out, per-layer lists at this layer."""
    out: Dict[str, Any] = {}
    for key, value in hf_config.items():
        if key in STACK_FIELDS:
            continue
        if isinstance(value, Mapping) and key.endswith("_config"):
            continue  # a vision or audio tower's config
        out[key] = value
    types = hf_config.get("layer_types")
    if isinstance(types, (list, tuple)) and layer_index < len(types):
        out["layer_type"] = types[layer_index]
    return _plain(out)


def key_of(content: Mapping[str, Any]) -> str:
    """The cache key (hex digest) of *content*."""
    text = json.dumps(_plain(content), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def entry_content(**parts: Any) -> Dict[str, Any]:
    """What identifies one census record: *parts*, the versions and the census's own version."""
    return _plain({**parts, "versions": versions(), "census_version": CENSUS_VERSION})


def _path(key: str, folder: str = "census") -> Path:
    return cache_dir() / folder / key[:2] / f"{key}.json"


# An entry is a few kilobytes; anything far larger is not one of ours and is not read.
MAX_ENTRY_BYTES = 4 * 1024 * 1024

# The record's figures: (TP 1 share, TP-split share) pairs in bytes a token, whose totals at TP 1 and TP 2 are
# what the census measured (ndcost.plugins.census.records.split); lone bytes a token; shares of a whole.
_PAIRS = (("saved_per_token", "saved_tp_per_token"), ("working_per_token", "working_tp_per_token"),
          ("selective_per_token", "selective_tp_per_token"))
_BYTES = ("working_input_per_token",)
_SHARES = ("working_grad_share", "recomputed_attention_mm_share", "recomputed_other_mm_share",
           "recomputed_scores_share")
_RESERVED = ("reserved_per_layer_per_token", "reserved_per_layer_tp_per_token", "reserved_working_per_token",
             "reserved_working_tp_per_token", "reserved_selective_per_layer_per_token",
             "reserved_selective_per_layer_tp_per_token", "reserved_selective_working_per_token",
             "reserved_selective_working_tp_per_token", "reserved_core_attention_per_layer_per_token",
             "reserved_core_attention_per_layer_tp_per_token", "reserved_core_attention_working_per_token",
             "reserved_core_attention_working_tp_per_token", "autocast_reserved_per_layer_per_token",
             "autocast_reserved_per_layer_tp_per_token", "autocast_reserved_working_per_token",
             "autocast_reserved_working_tp_per_token")
_COUNTS = ("flops_by_part", "flops_all_pairs_by_part", "forward_only_flops_by_part")

_unwritable: Set[str] = set()  # cache directories already warned about in this process


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} is {value!r}, not a finite number")
    return value


def _count(value: Any, where: str, whole: bool) -> None:
    """A count of FLOPs, bytes or launches: finite, >= 0, and whole where it counts one layer (not a mean)."""
    if _number(value, where) < 0 or (whole and value != int(value)):
        raise ValueError(f"{where} is {value!r}, not a {'whole ' if whole else ''}count >= 0")


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{where} is {value!r}, not a table by name")
    return value


def check_record(data: Any, content: Mapping[str, Any]) -> KindRecord:
    """The KindRecord an entry filed under *content* holds, or a ValueError saying what no census would write.

    The schema is :meth:`KindRecord.to_dict`'s, every field present. The
    kind and length are those of the key. A TP pair's totals at TP 1 and
    TP 2 (what the census measured) are bytes, never negative (one share of
    the pair may be: ``split`` derives them by difference); shares lie in
    [0, 1]; FLOPs and traffic are counts, whole where the record measures
    one layer (a stack census's are means over a kind's layers).
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"the record is {type(data).__name__}, not a mapping")
    fields = {a.name for a in attrs.fields(KindRecord)}
    if set(data) != fields:
        odd = sorted(set(data) - fields) + sorted(f"{name} (missing)" for name in fields - set(data))
        raise ValueError(f"the record's fields are not a KindRecord's: {', '.join(odd)}")
    for name in ("kind", "source"):
        if not isinstance(data[name], str) or not data[name]:
            raise ValueError(f"{name} is {data[name]!r}, not a name")
    if "kind" in content and data["kind"] != content["kind"]:
        raise ValueError(f"kind is {data['kind']!r}, filed under kind {content['kind']!r}")
    seq = data["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1 or seq != content.get("seq", seq):
        raise ValueError(f"seq is {seq!r}, filed under seq {content.get('seq')!r}")
    pairs = [(a, b, data[a], data[b]) for a, b in _PAIRS]
    ops, ops_tp = _table(data["ops"], "ops"), _table(data["ops_tp"], "ops_tp")
    pairs += [(f"ops[{op!r}]", f"ops_tp[{op!r}]", ops.get(op, 0), ops_tp.get(op, 0)) for op in {*ops, *ops_tp}]
    for name, tp_name, kept, kept_tp in pairs:
        if kept is None and kept_tp is None and name != "saved_per_token":  # a figure the record does not state
            continue
        kept, kept_tp = _number(kept, name), _number(kept_tp, tp_name)
        if kept + kept_tp < 0 or kept + kept_tp / 2 < 0:
            raise ValueError(f"{name} {kept!r} and {tp_name} {kept_tp!r} keep a negative number of bytes at "
                             f"TP 1 or 2")
    for name in _RESERVED:  # differences of two replays: either sign
        if data[name] is not None:
            _number(data[name], name)
    for name in _BYTES + _SHARES:
        if data[name] is not None and not 0 <= _number(data[name], name) <= (1 if name in _SHARES else math.inf):
            raise ValueError(f"{name} is {data[name]!r}, outside {'[0, 1]' if name in _SHARES else '>= 0'}")
    whole = content.get("what") != "stack"
    for name in _COUNTS:
        for part, value in _table(data[name], name).items():
            _count(value, f"{name}[{part!r}]", whole)
    for table, counts in _table(data["traffic"], "traffic").items():
        for part, value in _table(counts, f"traffic[{table!r}]").items():
            _count(value, f"traffic[{table!r}][{part!r}]", whole)
    return KindRecord.from_dict(data)


def _read(path: Path) -> Optional[str]:
    """The text of the entry at *path*; None where there is none, or where it is no regular file (then a warning).

    The file's type is read before it is opened, and again on the open file
    (opened without blocking): a FIFO under an entry's name would block the
    command forever, a directory or device is not an entry.
    """
    try:
        info = os.stat(path)
    except OSError:  # absent, or a directory on the way that is not one: nothing cached
        return None
    if stat.S_ISREG(info.st_mode):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if stat.S_ISREG(info.st_mode) and info.st_size <= MAX_ENTRY_BYTES:
                return handle.read(MAX_ENTRY_BYTES + 1).decode()
    what = "larger than any entry" if stat.S_ISREG(info.st_mode) else "not a regular file"
    warnings.warn(f"census cache entry {path} is {what} (mode {stat.filemode(info.st_mode)}, "
                  f"{info.st_size} bytes); not reading it, recomputing", CacheWarning, stacklevel=4)
    return None


def load(content: Mapping[str, Any]) -> Optional[KindRecord]:
    """The record cached under *content*, or None; a corrupt, stale or implausible entry warns and reads as missing."""
    key = key_of(content)
    path = _path(key)
    try:
        text = _read(path)
        if text is None:
            return None
        data = json.loads(text)
        if not isinstance(data, Mapping) or set(data) != {"key", "record"}:
            raise ValueError("it is not a mapping of 'key' and 'record'")
        if data["key"] != _plain(content):
            raise ValueError("its key does not match what it is filed under")
        return check_record(data["record"], _plain(content))
    except Exception as exc:  # anything unreadable is recomputed, never trusted
        warnings.warn(f"census cache entry {path} is corrupt or stale ({type(exc).__name__}: {exc}); "
                      f"recomputing it", CacheWarning, stacklevel=3)
        return None


def store(content: Mapping[str, Any], record: KindRecord) -> Path:
    """Write *record* under *content* atomically (a reader never sees half a file)."""
    return _write(_path(key_of(content)), {"key": _plain(content), "record": _plain(record.to_dict())})


def _write(path: Path, data: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def cached(content: Mapping[str, Any], compute: Callable[[], KindRecord]) -> KindRecord:
    """The record under *content*, computed and stored where missing or unusable.

    Where the cache cannot be written (a read-only directory, a file where
    a directory should be), the measured record is returned all the same,
    with one warning a directory a process.
    """
    found = load(content)
    if found is not None:
        return found
    record = compute()
    try:
        store(content, record)
    except OSError as exc:
        where = str(cache_dir())
        if where not in _unwritable:
            _unwritable.add(where)
            warnings.warn(f"census cache {where} cannot be written ({type(exc).__name__}: {exc}); using the "
                          f"measured figures without caching them (set NDCOST_CACHE_DIR to a writable directory)",
                          CacheWarning, stacklevel=2)
    return record


def cached_json(content: Mapping[str, Any], compute: Callable[[], Mapping[str, Any]],
                folder: str) -> Dict[str, Any]:
    """A JSON mapping under *content* in *folder* of the cache (not a census record), computed where missing."""
    path = _path(key_of(content), folder)
    if path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("key") != _plain(content):
                raise ValueError("its key does not match what it is filed under")
            return dict(data["value"])
        except Exception as exc:  # anything unreadable is recomputed, never trusted
            warnings.warn(f"cache entry {path} is corrupt or stale ({type(exc).__name__}: {exc}); recomputing it",
                          CacheWarning, stacklevel=3)
    value = _plain(compute())
    _write(path, {"key": _plain(content), "value": value})
    return dict(value)
