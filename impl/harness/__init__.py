"""The load harness: the fake vLLM router, the SDK-shaped load client and its report.

`router.py` (fake vLLM router), `load.py` (`hotpath loadtest`), `report.py` (pure functions over
the collected numbers), `presets.py` (named scenarios), `procs.py` (start, sample and stop the
router and server processes). Each runs as its own process; they share only URLs and JSON.
"""
