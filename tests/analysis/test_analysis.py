"""`impl.analysis` loaders: merging `hotpath bench` results files, reading asv result files."""

from __future__ import annotations

import json
from pathlib import Path

from impl import analysis


def _run(path: Path, when: str, sections: list[dict]) -> None:
    env = {"git_sha": "abc1234", "python": "3.11", "cpu": "x", "cpus": 2, "time": when}
    path.write_text(json.dumps({"environment": env, "quick": False, "sections": sections}))


def test_load_results_merges_a_directory_newest_section_wins(tmp_path: Path) -> None:
    old = {"family": "encode", "rows": [{"implementation": "wire", "seconds": 2.0}]}
    new = {"family": "encode", "rows": [{"implementation": "wire", "seconds": 1.0}]}
    pool = {"family": "pool", "rows": [{"implementation": "httpx", "in_flight": 8}]}
    _run(tmp_path / "b.json", "2026-11-29T10:00:00+0000", [old, pool])
    _run(tmp_path / "a.json", "2026-11-29T11:00:00+0000", [new])
    results = analysis.load_results(tmp_path)
    assert analysis.rows(results, "encode") == new["rows"]
    assert analysis.rows(results, "pool") == pool["rows"]
    assert analysis.rows(results, "decode") == []
    assert "2026-11-29T10:00" in analysis.provenance(results, "pool")
    assert "2026-11-29T11:00" in analysis.provenance(results, "encode")


def test_load_asv_expands_params(tmp_path: Path) -> None:
    """The shape asv 0.6 writes (asv.results.Results.save): one value per params combination."""
    (tmp_path / "benchmarks.json").write_text(
        json.dumps({"bench_x.Decode.time_decode": {"param_names": ["implementation", "tokens"]}})
    )
    machine = tmp_path / "vm"
    machine.mkdir()
    (machine / "machine.json").write_text("{}")
    columns = ["result", "params", "version", "started_at", "duration"]
    results = {
        "bench_x.Decode.time_decode": [
            [0.5, 0.25, None, 0.125],
            [["'json'", "'simdjson'"], ["128", "262144"]],
            "v1",
            1,
            2.0,
        ],
        "bench_x.Plain.time_plain": [[3.0], [], "v1"],
    }
    data = {"commit_hash": "deadbeef", "date": 1, "result_columns": columns, "results": results}
    (machine / "deadbeef-venv.json").write_text(json.dumps(data))
    rows = analysis.load_asv(tmp_path)
    decode = [r for r in rows if r["benchmark"].endswith("time_decode")]
    assert [(r["params"]["implementation"], r["params"]["tokens"], r["value"]) for r in decode] == [
        ("json", 128, 0.5),
        ("json", 262144, 0.25),
        ("simdjson", 128, None),
        ("simdjson", 262144, 0.125),
    ]
    plain = [r for r in rows if r["benchmark"].endswith("time_plain")]
    assert plain == [
        {
            "benchmark": "bench_x.Plain.time_plain",
            "params": {},
            "value": 3.0,
            "commit": "deadbeef",
            "date": 1,
            "machine": "vm",
        }
    ]
