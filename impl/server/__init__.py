"""The production server: a Tinker-SDK-compatible sampling API on FastAPI + uvicorn.

`hotpath serve` (cli.py) builds `Settings` (settings.py) from flags and HOTPATH_* variables,
picks each family's implementation (picks.py), and runs `create_app(settings)` (app.py) under
uvicorn. Routes are grouped by resource in routes/; the hot ones (asample, retrieve_future) are
raw ASGI. Results live in the future store (store/: the contract, the embedded memory store,
store/redis/ for the shared one); forward.py and upstream.py talk to the vLLM router, offloop/
decodes bodies off the event loop; baseline.py is the before-the-fixes configuration
(`--baseline`).
"""
