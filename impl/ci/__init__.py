"""CI and benchmark-history tooling around the asv suite in `benchmarks/`.

- `gate`: the regression gate (`make gate`): the previous commit vs HEAD, interleaved; its
  stages `gate_timers`, `gate_icount` and `gate_e2e` (with `e2e_rounds` and `trees`) share the
  shape of `stage`; `significance` is the timer stage's statistical rule.
- `repo`: the repository's root and the one `git()` every tool here runs git through.
- `gate_demo`: the gate on deliberate slowdowns in a throwaway repository (`make gate-demo`).
- `dashboard`: makes a published asv dashboard work offline (`make dashboard`).
- `perfjson`: reads `make perf --benchmark-json` files into rows for notebooks.

`impl/bench/` holds the `hotpath bench` sections; these tools only drive and read benchmarks.
"""
