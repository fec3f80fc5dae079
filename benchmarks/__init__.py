"""asv benchmark suites of hotpath (one module per family; shared seeded inputs in common.py)."""
