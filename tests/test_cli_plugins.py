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

KEYS = {"name", "distribution", "version", "registered"}


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.delenv("NDCOST_STRICT_PLUGINS", raising=False)
    manager.reset()
    yield
    manager.reset()


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
        lambda register: register("optimizer/adamw", "mine", override=True))
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
    assert captured.out == ""
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


def test_console_script_in_a_subprocess(tmp_path):
    cmd = [sys.executable, "-c", "import sys; from ndcost.cli import main; sys.exit(main(sys.argv[1:]))"]
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
