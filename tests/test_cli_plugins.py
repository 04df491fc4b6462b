"""`ndcost plugins` and the CLI conventions: one JSON document on stdout, exit 2 for usage, 1 for refusals."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types

import pytest

import ndcost
from ndcost import manager
from ndcost.cli import main
from ndcost.plugins.optimizers import Optimizer

KEYS = {"name", "distribution", "version", "registered"}


def test_plugins_json_is_one_array_of_entry_points(fresh, capsys):
    assert main(["plugins", "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)                                 # exactly one document
    assert isinstance(data, list) and data
    for item in data:
        assert KEYS <= set(item) and set(item) <= KEYS | {"error"}
        assert isinstance(item["registered"], list)
    by_name = {(d["distribution"], d["name"]): d for d in data}
    optimizers = by_name[("ndcost", "optimizers")]
    assert optimizers["version"] == ndcost.__version__
    assert {"optimizer/adamw", "optimizer/adam", "optimizer/sgd", "optimizer/adagrad"} <= set(
        optimizers["registered"])
    assert {("ndcost", name) for name in manager.ESSENTIAL} <= set(by_name)


def test_plugins_table(fresh, capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header == ["plugin", "distribution", "version", "module", "registered"]
    assert "ndcost.plugins.optimizers" in out and "4 keys" in out
    assert main(["plugins", "--keys"]) == 0
    assert "optimizer/adamw" in capsys.readouterr().out


def test_plugins_table_shows_overrides(monkeypatch, capsys):
    module = types.ModuleType("my_optimizers")
    module.ndcost_register = ndcost.hookimpl(
        lambda register: register("optimizer/adamw", Optimizer(name="adamw", states_per_parameter=2), override=True))
    monkeypatch.setattr(manager, "_current", manager.load(extra_modules={"mine": module}))
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "overrides:" in out and "optimizer/adamw" in out and "my_optimizers" in out


@pytest.mark.parametrize("argv", [["plugins", "--no-such-flag"], ["no-such-command"], []])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as err:
        code = main(argv)
        raise SystemExit(code)
    assert err.value.code == 2
    assert capsys.readouterr().out == ""                   # nothing on stdout


def test_refusal_is_one_line_exit_1(fresh, monkeypatch, capsys):
    real = manager._entry_points
    monkeypatch.setattr(manager, "_entry_points", lambda: [ep for ep in real() if ep.name != "storage"])
    assert main(["plugins", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"]["command"] == "plugins"  # the refusal's document
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ndcost plugins:") and "pip install" in lines[0]


def test_broken_plugin_warns_on_stderr_and_json_stays_clean(fresh, tmp_path, monkeypatch, capsys):
    info = tmp_path / "ndcost_cli_broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ndcost-cli-broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ndcost.plugins]\ncli_broken = ndcost_cli_broken\n")
    (tmp_path / "ndcost_cli_broken.py").write_text(textwrap.dedent("""
        raise ImportError("needs a library that is not installed")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["plugins", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    broken = [d for d in data if d["name"] == "cli_broken"]
    assert broken and broken[0]["distribution"] == "ndcost-cli-broken" and broken[0]["registered"] == []
    assert "needs a library" in broken[0]["error"]
    assert "ndcost-cli-broken" in captured.err and "needs a library" in captured.err
    sys.modules.pop("ndcost_cli_broken", None)


def test_python_m_ndcost_in_a_subprocess(tmp_path):
    cmd = [sys.executable, "-m", "ndcost"]
    ok = subprocess.run(cmd + ["plugins", "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert isinstance(json.loads(ok.stdout), list)
    bad = subprocess.run(cmd + ["plugins", "--bogus"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and bad.stdout == "" and "usage" in bad.stderr


def test_unexpected_error_is_one_line_and_debug_shows_it(monkeypatch, capsys):
    from ndcost.commands import plugins as command

    def boom(args):
        raise RuntimeError("something broke inside")

    monkeypatch.setattr(command, "run", boom)
    assert main(["plugins"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "something broke inside" in err and "Traceback" not in err
    with pytest.raises(RuntimeError):
        main(["plugins", "--debug"])


# ---------------------------------------------------------------------------
# the conventions, command by command: usage errors exit 2, refusals one line exit 1
# ---------------------------------------------------------------------------
USAGE_ERRORS = {
    "params": [["params"], ["params", "llama-3.1-8b", "--bogus"]],
    "census": [["census", "llama-3.1-8b"], ["census", "llama-3.1-8b", "--seq", "abc"]],
    "estimate": [["estimate", "llama-3.1-8b"], ["estimate", "llama-3.1-8b", "--strategy", "seq=8", "--census", "x"]],
    "compare": [["compare", "llama-3.1-8b"], ["compare", "llama-3.1-8b", "--strategy", "seq=8", "--census", "x"]],
    "search": [["search", "llama-3.1-8b"], ["search", "llama-3.1-8b", "--devices", "8", "--global-batch", "x",
                                            "--seq", "4096"]],
    "calibrate": [["calibrate"], ["calibrate", "m.json", "--census", "on"]],
    "verify": [["verify"], ["verify", "llama-3.1-8b", "--seq", "abc"]],
    "plugins": [["plugins", "extra"]],
    "list": [["list"], ["list", "widgets"]],
    "fields": [["fields", "extra"]],
}
REFUSALS = {  # argv, and what the one line must name
    "params": (["params", "no-such-model"], "unknown model 'no-such-model'"),
    "census": (["census", "llama-3.1-8b", "--seq", "0"], "--seq must be a positive"),
    "estimate": (["estimate", "llama-3.1-8b", "--strategy", "tp=0,seq=4096", "--census", "off"], "Strategy.tp"),
    "compare": (["compare", "llama-3.1-8b", "--strategy", "tp=0,seq=4096", "--census", "off"], "Strategy.tp"),
    "search": (["search", "llama-3.1-8b", "--devices", "0", "--global-batch", "8", "--seq", "4096", "--census", "off"],
               "--devices 0"),
    "calibrate": (["calibrate", "/nonexistent/measurements.json"], "/nonexistent/measurements.json"),
    "verify": (["verify", "no-such-model"], "unknown model 'no-such-model'"),
}


def test_every_listed_command_is_covered_here():
    from ndcost.cli import COMMANDS

    assert set(COMMANDS) == set(USAGE_ERRORS) and set(COMMANDS) - {"plugins", "list", "fields"} == set(REFUSALS)


@pytest.mark.parametrize("argv", [a for cases in USAGE_ERRORS.values() for a in cases], ids=lambda a: " ".join(a))
def test_usage_error_of_each_command_exits_2_with_nothing_on_stdout(argv, capsys):
    with pytest.raises(SystemExit) as err:
        main(argv + ["--json"])
    assert err.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "usage: ndcost" in captured.err and "error:" in captured.err


@pytest.mark.parametrize("command", sorted(REFUSALS))
def test_refusal_of_each_command_is_one_line_exit_1_and_debug_shows_the_traceback(command, capsys):
    argv, names = REFUSALS[command]
    assert main(argv + ["--json"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"ndcost {command}: ") and names in lines[0] and "Traceback" not in lines[0]
    assert json.loads(captured.out)["error"] == {"command": command, "kind": json.loads(captured.out)["error"]["kind"],
                                                 "message": lines[0][len(f"ndcost {command}: "):]}
    with pytest.raises(ndcost.NdcostError):
        main(argv + ["--debug"])


@pytest.mark.slow
def test_refusal_and_usage_error_in_a_subprocess(tmp_path):
    """The installed console script: refusal exit 1 with one stderr line, usage exit 2, --debug a traceback."""
    import shutil

    script = shutil.which("ndcost") or pytest.skip("the ndcost console script is not on PATH")
    argv, names = REFUSALS["estimate"]
    refused = subprocess.run([script, *argv, "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert refused.returncode == 1 and json.loads(refused.stdout)["error"]["command"] == "estimate"
    assert refused.stderr.count("\n") == 1 and names in refused.stderr
    assert json.loads(refused.stdout)["error"]["message"] in refused.stderr
    debug = subprocess.run([script, *argv, "--debug"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "InvalidValue" in debug.stderr
    usage = subprocess.run([script, "estimate", "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert usage.returncode == 2 and usage.stdout == "" and "usage: ndcost estimate" in usage.stderr


@pytest.mark.parametrize("argv", [["params", "llama-3.1-8b"],
                                  ["estimate", "llama-3.1-8b", "--strategy", "fsdp=8,seq=1024", "--census", "off"]],
                         ids=lambda a: a[0])
def test_json_is_exactly_one_document_on_stdout(argv, capsys):
    assert main(argv + ["--json"]) == 0
    out = capsys.readouterr().out
    data, end = json.JSONDecoder().raw_decode(out)
    assert out[end:].strip() == "" and isinstance(data, dict)
    if argv[0] == "estimate":  # each figure says which plugin produced it
        assert "optimizer/adamw" in data["sources"]["optimizer_states"]


def test_json_and_debug_also_go_before_the_command(fresh, capsys):
    assert main(["--json", "plugins"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)
    with pytest.raises(ndcost.NdcostError):
        main(["--debug", "params", "no-such-model"])


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`ndcost plugins --json | head -c 1`: the closed pipe is an exit 1, not a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "ndcost", "plugins", "--json", "--keys"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1 and "Traceback" not in err and "BrokenPipe" not in err
