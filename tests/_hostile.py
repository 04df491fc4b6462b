"""What the fuzz suite and the hostile corpus check of every answer: a result keeping every invariant, or a refusal.

The invariants are issue 12's: every figure finite; bytes exact non-negative integers; a stage's peak what its
categories sum to, the top-level peak the most any stage holds; times positive and finite, MFU in (0, 1]; JSON
strict (no NaN, no Infinity). A refusal is an :class:`ndcost.errors.NdcostError` whose message is one line, and
through the CLI exit 1 with one stderr line, no traceback, and no exception but an NdcostError leaving the command
(the CLI's generic handlers in ``ndcost.cli.main`` never reached).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import signal
from typing import Any, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from ndcost.errors import NdcostError

# issue 12: zero hangs, 10 s a case
HANG_GUARD_SECONDS = 10.0


class Hang(BaseException):
    """A case ran past the hang guard (a BaseException, so no ``except Exception`` in ndcost can swallow it)."""


@contextlib.contextmanager
def hang_guard(seconds: float = HANG_GUARD_SECONDS) -> Iterator[None]:
    """Raise :class:`Hang` in this (the main) thread once *seconds* pass: a SIGALRM timer, restored after."""
    def ring(signum, frame):
        raise Hang(f"the case ran past {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_refusal(exc: BaseException) -> None:
    """*exc* is a refusal: an NdcostError (never a foreign exception) whose message is one non-empty line."""
    assert isinstance(exc, NdcostError), f"foreign exception {type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    text = str(exc)
    assert text.strip() and "\n" not in text, f"{type(exc).__name__} message is not one line: {text!r}"


def strict_json(data: Any) -> str:
    """*data* as JSON, refusing NaN and Infinity (what ``--json`` must write)."""
    from ndcost.cli import _json_default
    return json.dumps(data, allow_nan=False, default=_json_default)


def _no_constant(name: str) -> Any:
    raise AssertionError(f"--json wrote {name}, which strict JSON has not")


def parse_strict_json(text: str) -> Any:
    """The one JSON document in *text*; NaN, Infinity and -Infinity refused."""
    return json.loads(text, parse_constant=_no_constant)


# ---------------------------------------------------------------------------
# invariants of results
# ---------------------------------------------------------------------------
def _exact_bytes(value: Any, what: str) -> int:
    assert isinstance(value, (int, np.integer)) and not isinstance(value, bool), f"{what} is {value!r}, not an int"
    assert value >= 0, f"{what} is negative: {value}"
    return int(value)


def check_time(time: Mapping[str, Any], what: str) -> None:
    """A step's times: the step and throughput positive and finite, every component finite and >= 0, MFU in (0, 1]."""
    for name in ("step_seconds", "tokens_per_second"):
        value = float(time[name])
        assert math.isfinite(value) and value > 0, f"{what}: {name} = {value}, not positive and finite"
    for name in ("compute_seconds", "communication_seconds", "exposed_communication_seconds", "bubble_seconds",
                 "optimizer_seconds", "offload_seconds", "exposed_offload_seconds"):
        value = float(time[name])
        assert math.isfinite(value) and value >= 0, f"{what}: {name} = {value}, not finite and >= 0"
    mfu = float(time["mfu"])
    assert 0 < mfu <= 1, f"{what}: mfu = {mfu}, not in (0, 1]"


def check_cost_dict(data: Mapping[str, Any]) -> None:
    """A StrategyCost's ``to_dict()`` (or ``ndcost estimate --json``): stages, peak and time keep the invariants."""
    assert data["valid"] is True and data["reason"] == "", f"a returned cost is invalid: {data['reason']!r}"
    stages = data["stages"]
    assert stages, "a valid cost has no stages"
    peaks = []
    for stage in stages:
        what = f"stage {stage['stage']}"
        total = sum(_exact_bytes(v, f"{what} {c}") for c, v in stage["bytes_by_category"].items())
        peak = _exact_bytes(stage["peak_bytes"], f"{what} peak_bytes")
        assert peak == total, f"{what}: peak_bytes {peak} but its categories sum to {total}"
        peaks.append(peak)
    top = _exact_bytes(data["peak_bytes"], "peak_bytes")
    assert top == max(peaks), f"peak_bytes {top} but the stages' most is {max(peaks)}"
    host = _exact_bytes(data["host_bytes"], "host_bytes")
    most = max(_exact_bytes(s["host_bytes"], f"stage {s['stage']} host_bytes") for s in stages)
    assert host == most, f"host_bytes {host} but the stages' most is {most}"
    node = _exact_bytes(data["host_bytes_per_node"], "host_bytes_per_node")
    assert node >= host, f"host_bytes_per_node {node} is below a device's host_bytes {host}"
    if data.get("time") is not None:
        check_time(data["time"], "time")
    strict_json(data)


def check_batch(result: Any, rows: int) -> None:
    """A BatchResult of *rows* rows: valid rows keep the invariants; invalid ones hold their reason and zeros."""
    assert len(result) == rows, f"{len(result)} results for {rows} strategies"
    valid = np.asarray(result.valid)
    assert valid.dtype == bool
    reason = np.asarray(result.reason)
    for name in ("peak_bytes", "stage_bytes", "stage_peak_bytes"):
        array = np.asarray(getattr(result, name))
        assert array.dtype.kind == "i", f"{name} holds {array.dtype}, not exact integers"
        negative = (array < 0).any(axis=tuple(range(1, array.ndim))) if array.ndim > 1 else array < 0
        assert not negative.any(), f"{name} holds a negative figure at rows {np.flatnonzero(negative)}"
    sums = result.stage_bytes.sum(axis=-1)
    bad = (sums != result.stage_peak_bytes).any(axis=-1) & valid
    assert not bad.any(), f"rows {np.flatnonzero(bad)}: a stage's peak is not what its categories sum to"
    most = result.stage_peak_bytes.max(axis=-1) if result.stage_peak_bytes.shape[-1] else np.zeros(rows, np.int64)
    bad = (most != result.peak_bytes) & valid
    assert not bad.any(), f"rows {np.flatnonzero(bad)}: peak_bytes is not the most a stage holds"
    for name in ("host_bytes", "stage_host_bytes", "host_bytes_per_node"):
        array = np.asarray(getattr(result, name))
        assert array.dtype.kind == "i" and not (array < 0).any(), f"{name}: not non-negative integers"
    bad = (result.stage_host_bytes.max(axis=-1, initial=0) != result.host_bytes) | \
        (result.host_bytes_per_node < result.host_bytes)
    assert not bad.any(), f"rows {np.flatnonzero(bad)}: host bytes are not the most a stage holds, or a node less"
    for i in np.flatnonzero(valid):
        assert reason[i] == "", f"row {i} is valid with a reason: {reason[i]!r}"
        assert result.num_stages[i] >= 1
    for i in np.flatnonzero(~valid):
        assert isinstance(reason[i], str) and reason[i].strip(), f"row {i} is invalid without a reason"
        assert result.peak_bytes[i] == 0 and not result.fits[i]
    # fits: reserved bytes (the allocated peak where reserved is not claimed) within the memory less the context
    needed = np.where(result.reserved_bytes >= 0, result.reserved_bytes, result.peak_bytes)
    usable = result.memory_bytes - result.cuda_context_bytes
    assert (np.asarray(result.fits) == (valid & (needed <= usable))).all()
    if result.time is not None:
        for i in np.flatnonzero(valid):
            check_time({k: v[i] for k, v in result.time.items() if k != "provenance"}, f"row {i}")


# ---------------------------------------------------------------------------
# the CLI, in this process
# ---------------------------------------------------------------------------
@contextlib.contextmanager
def escaped_exceptions() -> Iterator[List[BaseException]]:
    """Every exception but an NdcostError that leaves a CLI command's ``run`` while this is open.

    ``ndcost.cli.main`` turns such an exception into its generic one-line messages ("internal error", or
    "rerun with --debug"); what lands in the list is what reached those handlers. Each command module's
    ``run`` is wrapped here, where ``ndcost.cli.build_parser`` reads it.
    """
    from ndcost import cli

    escaped: List[BaseException] = []
    originals = []
    for _name, module in cli._commands():
        run = module.run

        def probed(args, run=run):
            try:
                return run(args)
            except NdcostError:
                raise
            except Exception as exc:
                escaped.append(exc)
                raise
        originals.append((module, run))
        module.run = probed
    try:
        yield escaped
    finally:
        for module, run in originals:
            module.run = run


def run_cli(argv: List[str]) -> Tuple[int, str, str, Optional[BaseException]]:
    """``ndcost *argv*`` in this process under the hang guard: (exit code, stdout, stderr, escaped exception)."""
    from ndcost import cli

    out, err = io.StringIO(), io.StringIO()
    with escaped_exceptions() as escaped, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            hang_guard():
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue(), escaped[0] if escaped else None


def check_cli_answer(code: int, stdout: str, stderr: str, escaped: Optional[BaseException]) -> Any:
    """An answer of ``ndcost ... --json``: exit 0 with one strict JSON document (returned), or exit 1 with one
    stderr line, its refusal's one document on stdout, and no exception but an NdcostError behind it."""
    assert escaped is None, (f"the CLI's generic handler was reached by {type(escaped).__module__}."
                             f"{type(escaped).__qualname__}: {escaped}")
    assert "Traceback" not in stderr, stderr
    if code == 0:
        return parse_strict_json(stdout)
    assert code == 1, f"exit {code}: {stderr!r}"
    lines = stderr.splitlines()
    assert len(lines) == 1, f"a refusal wrote {len(lines)} stderr lines: {stderr!r}"
    error = parse_strict_json(stdout)["error"]
    assert error["message"] in lines[0], f"the refusal's document {stdout!r} is not its line {lines[0]!r}"
    return None
