"""The fake vLLM router (`hotpath router`): a real aiohttp server answering like vLLM.

`server` is the process (modes, workers, faults, the command's flags); `bodies` reads a
completion request as vLLM does and renders the body it answers with; `stats` holds the
counters `GET /stats` reports, summed over the worker processes.
"""
