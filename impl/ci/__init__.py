"""CI and benchmark-history tooling around the asv suite in `benchmarks/`.

- `gate`: the regression gate (`make gate`): the previous commit vs HEAD, interleaved.
- `gate_demo`: the gate on deliberate slowdowns in a throwaway repository (`make gate-demo`).
- `dashboard`: makes a published asv dashboard work offline (`make dashboard`).
- `perfjson`: reads `make perf --benchmark-json` files into rows for notebooks.

`impl/bench/` holds the `hotpath bench` sections; these tools only drive and read benchmarks.
"""
