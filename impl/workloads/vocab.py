"""A real LLM tokenizer that works offline: Mistral's Tekken vocabulary, through mistral-common.

The vocabulary ships inside the mistral-common wheel (`mistral_common/data/tekken_240911.json`:
131,072 ids, the first 1,000 special tokens, then byte-level BPE ranks that tiktoken runs), so
nothing is downloaded at run time. It is loaded once per process (`load()` caches).

`Vocab` keeps per id what the body generator needs: the token's bytes (`pieces`; a special
token's are its text, e.g. `</s>`), the string a tokenizer's `decode([id])` gives for it alone
(`alone`: invalid UTF-8 replaced by U+FFFD, as HF tokenizers and tiktoken do) and whether that
string ends in U+FFFD (`ends_bad`: an incomplete UTF-8 sequence, which vLLM corrects; see
`impl.workloads.realtext`). A missing mistral-common is reported by `unavailable_reason()` with
the install hint; importing this module never needs it.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

import numpy as np

TEKKEN_FILE = "tekken_240911.json"
INSTALL_HINT = "pip install 'hotpath[realtext]' (mistral-common ships the Tekken vocabulary)"
REPLACEMENT = "\ufffd"


class Vocab:
    """Token ids <-> bytes and strings of one tokenizer, precomputed per id."""

    def __init__(self, tekkenizer: object) -> None:
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        self._tok = tekkenizer
        self.size = int(tekkenizer.n_words)
        self.num_special = int(tekkenizer.num_special_tokens)
        self.bos, self.eos = int(tekkenizer.bos_id), int(tekkenizer.eos_id)
        keep = SpecialTokenPolicy.KEEP
        pieces = [tekkenizer.id_to_byte_piece(i, keep) for i in range(self.size)]
        self.pieces = np.array(pieces, dtype=object)
        self.alone = np.array([p.decode("utf-8", "replace") for p in pieces], dtype=object)
        self.ends_bad = np.array([s.endswith(REPLACEMENT) for s in self.alone.tolist()])

    def encode(self, text: str) -> np.ndarray:
        """int32 token ids of `text` (no BOS/EOS)."""
        return np.asarray(self._tok.encode(text, bos=False, eos=False), dtype=np.int32)

    def decode(self, ids: list[int]) -> str:
        """What `tokenizer.decode(ids)` gives: the tokens' bytes, invalid UTF-8 replaced."""
        return b"".join(self.pieces[i] if 0 <= i < self.size else b"" for i in ids).decode(
            "utf-8", "replace"
        )


def unavailable_reason() -> str | None:
    """Why the tokenizer cannot load here (with the install hint), or None."""
    if importlib.util.find_spec("mistral_common") is None:
        return f"mistral-common is not installed: {INSTALL_HINT}"
    if not _vocabulary_path().is_file():
        return f"mistral-common has no {TEKKEN_FILE}: {INSTALL_HINT}"
    return None


def _vocabulary_path() -> Path:
    spec = importlib.util.find_spec("mistral_common")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "data" / TEKKEN_FILE


@cache
def load() -> Vocab:
    """The Tekken vocabulary (once per process); RuntimeError with the install hint if absent."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    return Vocab(Tekkenizer.from_file(str(_vocabulary_path())))
