"""`hotpath profile`: the speedscope summary arithmetic, and one real py-spy recording."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from impl import cli, profile, registry

ROOT = Path(__file__).resolve().parents[1]


def _speedscope(path: Path, profiles: list[tuple[str, list[list[int]]]], frames: list) -> Path:
    data = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": [{"name": n, "file": f, "line": 0} for n, f in frames]},
        "profiles": [
            {
                "type": "sampled",
                "name": name,
                "unit": "seconds",
                "startValue": 0,
                "endValue": len(samples),
                "samples": samples,
                "weights": [0.01] * len(samples),
            }
            for name, samples in profiles
        ],
    }
    path.write_text(json.dumps(data))
    return path


def test_summarize_counts_self_and_total_per_function(tmp_path: Path) -> None:
    """Self = leaf share; total counts a function once per sample even when it recurses."""
    frames = [
        ("<module>", str(ROOT / "impl" / "profile.py")),  # the loop's frame: left out of total
        ("decode", "/x/site-packages/lib/a.py"),
        ("parse", "/x/site-packages/lib/a.py"),
        ("parse", "/x/site-packages/lib/a.py"),  # same function, another line
        ("write", "/usr/lib/libc.so"),
        ("0x7f00aa", "/usr/lib/libc.so.6"),  # a native frame without a symbol
    ]
    main = [[0, 1, 2], [0, 1, 2, 3], [0, 1], [0, 4], [0, 1, 5, 5]]
    other = [[4], [4], [4], [4], [5, 4]]
    summary = profile.summarize(
        _speedscope(tmp_path / "p.speedscope.json", [("main", main), ("other", other)], frames)
    )
    assert summary["samples"] == 10
    self_ = dict(summary["self"])
    total = dict(summary["total"])
    assert self_ == pytest.approx(
        {
            "parse (lib/a.py)": 2 / 10,
            "decode (lib/a.py)": 1 / 10,
            "write (libc.so)": 6 / 10,
            "[libc.so.6] under decode": 1 / 10,  # an unresolved leaf names its caller
        }
    )
    assert total["parse (lib/a.py)"] == pytest.approx(2 / 10)  # not 3/10: counted once
    assert total["decode (lib/a.py)"] == pytest.approx(4 / 10)
    assert not any("impl/profile.py" in key or "unresolved" in key for key in total)
    assert dict(summary["threads"]) == pytest.approx({"main": 0.5, "other": 0.5})
    table = profile.render_summary(summary, top=2)
    assert "60.0% | `write (libc.so)`" in table
    assert "threads: main 50%, other 50%" in table


@pytest.mark.heavy
def test_resolve_names_and_picked() -> None:
    with pytest.raises(LookupError, match="known"):
        profile.resolve("encode", "no-such-encoder")
    name, why = profile.resolve("encode", "picked")
    assert name in registry.available("encode") and why.startswith("picked")


@pytest.mark.parametrize(
    "command",
    [
        ["profile", "encode", "wire", "--seconds", "1", "--out"],
        ["loadtest", "--preset", "small-2048", "--num-requests", "8", "--profile"],
    ],
    ids=["profile", "loadtest-profile"],
)
def test_missing_pyspy_says_what_and_how_to_install(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without py-spy: exit 2 and one line naming py-spy and the extra before anything starts."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = tmp_path / "out"
    assert cli.main([*command, str(out)]) == 2
    err = capsys.readouterr().err
    assert "py-spy, which is not installed" in err
    assert "pip install 'hotpath[dev]'" in err
    assert "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob("out*"))


@pytest.mark.heavy
def test_profile_records_an_encode_loop(tmp_path: Path) -> None:
    """A real recording: the loop child runs, py-spy writes both files, the summary names encode."""
    pyspy = Path(sys.executable).with_name("py-spy")
    if not pyspy.exists() and shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed (pip install 'hotpath[dev]')")
    command = [sys.executable, "-m", "impl.cli", "profile", "encode", "wire"]
    command += ["--seconds", "1", "--rate", "50", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = (done.stderr + done.stdout).lower()
    if (
        done.returncode
        and "py-spy failed" in output
        and ("permission" in output or "ptrace" in output)
    ):
        pytest.skip(f"py-spy cannot attach to a process here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "encode-wire.speedscope.json").read_text())
    assert data["hotpath"]["implementation"] == "wire"
    assert data["hotpath"]["input"] == f"samples.sized({profile.ENCODE_TOKENS})"
    assert data["hotpath"]["environment"]["python"]
    svg = (tmp_path / "encode-wire.svg").read_text()
    assert "<svg" in svg[:2000]
    summary = profile.summarize(tmp_path / "encode-wire.speedscope.json")
    assert summary["samples"] >= 10
    assert any("impl/encode/" in key for key, _ in summary["total"][:5]), summary["total"][:5]
    assert "wrote" in done.stdout


COMMITTED = sorted((ROOT / "profiles").glob("*.speedscope.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name.removesuffix(".speedscope.json"))
def test_committed_profile_is_documented_and_small(path: Path) -> None:
    """Each committed profile has its SVG, says how it was made, fits git, and is in the README."""
    stem = path.name.removesuffix(".speedscope.json")
    svg = path.with_name(stem + ".svg")
    assert svg.is_file(), f"{svg.name} is missing"
    for file in (path, svg):
        assert file.stat().st_size < 2_000_000, f"{file.name} is too big for git"
    facts = json.loads(path.read_text())["hotpath"]
    assert facts["command"].startswith("hotpath profile "), facts
    readme = (ROOT / "profiles" / "README.md").read_text()
    assert f"{stem}.speedscope.json" in readme and facts["command"] in readme
