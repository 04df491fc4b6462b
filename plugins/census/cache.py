"""The census's disk cache: one JSON file a record, keyed by what decides the measurement.

The key is the content of the layer kind's own config (the whole model's
stack-level fields left out, so a 1-layer and a 60-layer model of the same
widths share an entry), the sequence length, the runtime profile's content,
and the torch and Transformers versions. Computing it imports neither torch
nor Transformers, so a cached resolve stays cheap. A corrupt or stale entry
is recomputed with a warning.

The directory is ``$NDCOST_CACHE_DIR`` if set, else the user cache directory
(``$XDG_CACHE_HOME/ndcost``, ``~/.cache/ndcost``; ``~/Library/Caches/ndcost``
on macOS; ``%LOCALAPPDATA%\\ndcost`` on Windows).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

from ndcost.records import KindRecord

# Bumped whenever the census's rules change what it measures.
CENSUS_VERSION = 5

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


def load(content: Mapping[str, Any]) -> Optional[KindRecord]:
    """The record cached under *content*, or None; a corrupt or stale entry warns and reads as missing."""
    key = key_of(content)
    path = _path(key)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("key") != _plain(content):
            raise ValueError("its key does not match what it is filed under")
        return KindRecord.from_dict(data["record"])
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
    """The record under *content*, computed and stored where missing or unusable."""
    found = load(content)
    if found is not None:
        return found
    record = compute()
    store(content, record)
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
