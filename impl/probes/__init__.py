"""One-off probes: the scripts behind figures in docs/measurements.md, each run by hand.

A probe measures one claim once, on the machine it runs on, and prints what it saw; it is not
a benchmark (`benchmarks/`, `perf/`, `hotpath bench` track those across commits) and not a test
(the tests assert the same claims as ratios or counts). Each runs as `python -m
impl.probes.NAME`; its docstring says what it measures and how. The page quoting it:

- `gil_share`: the share of its solo rate a Python thread keeps while another decodes 20 MB
  (docs/decode.md);
- `limits_decode_cost`: the CPU the decode contract's limit checks cost on the 262144-token
  body (docs/decode.md: limits);
- `limits_junk`: 16 concurrent 30 MiB junk requests, their statuses, the server's peak RSS
  growth and a real sample afterwards (docs/server.md: limits and the error shape);
- `router_huge_prompt`: the fake router's render latency before and after one 2M-token prompt
  (its body cache);
- `metrics_cost`: server CPU per request with and without the Prometheus metrics, side by side
  (docs/metrics.md);
- `store_calls`: round trips and commands per result on the shared store, counted
  (docs/shared-store.md);
- `offloop`: what handing a body to a decode process costs the event loop, per body size
  (docs/offloop.md);
- `probe_rates`: /livez, /healthz and /readyz under `wrk`, req/s and server CPU per request
  (docs/server.md: probes);
- `store_aof`: the same load on a redis-server with and without the embedded store's
  append-only file (docs/measurements.md).
- `waiting_answers`: the memory an answer waiting for the body budget holds in the server's
  process, per pool implementation (docs/offloop.md).
- `decode_builds`: the installed build of a compiled decoder against another build of it (an
  older commit's), side by side on every body kind (docs/native.md: comparing two builds).
- `floors`: the CPU of each stage a long result goes through (receive, copy, decode, encode,
  hand-over, serve) beside its floor on this machine (docs/offloop.md: where a long result's
  CPU goes).
- `machine_noise`: how far a fixed computation's time moves on this machine, beside a decode's,
  and how closely the two move together (docs/native.md: how noisy the machine is).
"""
