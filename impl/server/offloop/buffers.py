"""Receive buffers a fetch process reuses for long router bodies.

Why it is fast: a fresh buffer of 17 MB is its own mapping (`return_big_buffers`), so every
body read into a fresh one pays a page fault and the kernel's zeroing per 4 KiB page, and its
unmapping when freed; `bytes(buffer)` after the read pays all of that once more, and a memcpy.
A fetch process instead reads each long body into a buffer it keeps (`BodyBuffers.take`), hands
the decoder a `memoryview` of exactly the body's bytes, a NUL right after them in the buffer
(the compiled decoders read it in place, `impl.decode._nogil.in_place`; the others copy it to
bytes), and takes the buffer back once the SampleResponse bytes exist (`give`): in the steady
state a body costs the kernel's copy into the pool's chunk and one memcpy into warm pages,
nothing else. `python -m impl.probes.floors` measures each of these against its floor.

Safety: `give` keeps a buffer only when nothing exports it any more (a bytearray cannot change
size while exported: an array or a view over the body that outlived its decode makes `give`
drop the buffer, not reuse it). Only
`keep_bytes` of idle buffers stay (the largest are dropped first), so a burst of long bodies
leaves at most that much behind; a body that arrives while every kept buffer is in use gets a
new one, so the body budget (`--max-body-bytes-in-flight`) still bounds what is held.
"""

from __future__ import annotations

from impl._figures import figures

#: buffers are sized in steps of this, so bodies of nearby sizes share them
STEP = 1 << 20
#: idle bytes one process keeps by default (one 212k-token vLLM body)
KEEP_BYTES = 18 << 20


class BodyBuffers:
    """A free list of `bytearray`s: `take(length)` a writable view of `length` bytes, `give`
    it back when nothing reads it any more."""

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep_bytes = keep_bytes
        self._idle: list[bytearray] = []
        #: buffers made, views taken, views given back and reused, views that could not be
        #: released (their buffer dropped)
        self.made = self.taken = self.reused = self.pinned = 0

    def idle_bytes(self) -> int:
        return sum(len(buffer) for buffer in self._idle)

    def take(self, length: int) -> memoryview:
        """A view of the first `length` writable bytes (contents undefined) of a buffer whose
        byte right after them is a NUL (`impl.decode._nogil.in_place`)."""
        self.taken += 1
        fits = [b for b in self._idle if len(b) > length]
        if fits:
            buffer = min(fits, key=len)
            self._idle.remove(buffer)
            self.reused += 1
        else:
            buffer = bytearray(-(-(length + 1) // STEP) * STEP)
            self.made += 1
        buffer[length] = 0  # the NUL the compiled decoders read past a body they read in place
        return memoryview(buffer)[:length]

    def give(self, view: memoryview) -> None:
        """`view` (from `take`) is no longer read by this process: keep its buffer for the next
        body, unless something still holds it or the idle buffers are at `keep_bytes`."""
        buffer = view.obj
        if not isinstance(buffer, bytearray) or any(b is buffer for b in self._idle):
            return
        try:
            view.release()
            # a bytearray cannot change size while anything exports it (an array over the
            # body, a view of the view): shrink and regrow by one byte, which moves nothing
            buffer.pop()
            buffer.append(0)
        except BufferError:  # something still reads the body: leave the buffer to it
            self.pinned += 1
            return
        self._idle.append(buffer)
        self._idle.sort(key=len)
        while self._idle and self.idle_bytes() > self.keep_bytes:
            self._idle.pop()  # the largest goes first

    def stats(self) -> dict[str, int]:
        return figures(self, "made", "taken", "reused", "pinned", idle_bytes=self.idle_bytes())
