"""hotpath: interchangeable implementations of each step on an LLM sampling server's hot path.

Nothing heavy is imported here: families load their implementations lazily through
`impl.registry`.
"""

__version__ = "0.2.0"
