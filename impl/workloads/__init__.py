"""The inputs every benchmark, test, probe and the fake router are fed: seeded vLLM bodies.

`synthetic` draws tokens and logprobs from a seeded generator and renders them as vLLM's
`/v1/completions` bodies (minimal or logprobs=1); `realtext` renders real text (prose, code,
multilingual, mixed) through a real tokenizer (`vocab`: Mistral's Tekken vocabulary, offline)
from passages every machine has (`textsources`, `corpus/`), every way real servers render JSON.
Everything is deterministic for its arguments and cached by size, so figures stay comparable.
"""
