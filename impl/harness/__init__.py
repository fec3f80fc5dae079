"""The load harness: the fake vLLM router, the SDK-shaped load client and its report.

`router/` (the fake vLLM router, `hotpath router`), `client/` (the client processes: the
SDK-shaped HTTP client and the real-SDK driver), `load` (`hotpath loadtest`), `drive` (spawns
the client processes and merges what they report), `presets` (named scenarios), `procs` (start
and stop the router and server processes), `watch` (the server's RSS, CPU, fds and probes while
a load runs), `report` and `steps` (pure functions over the collected numbers), `faults` and
`burner` (a killed worker, a busy host). Each runs as its own process; they share only URLs and
JSON. The bodies they serve come from `impl.workloads`.
"""
