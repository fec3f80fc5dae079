"""`hotpath loadtest --client sdk`: one client process driving the server through the real SDK.

The unmodified SDK (extra `sdk`, 0.38) does its own dispatch limits, polling and retries; this
client process only keeps `max_outstanding` samples in flight and checks each `SampleResponse`
the same way the HTTP client does. The SDK does not expose the wire bytes, so the MB/s figure
counts 8 bytes per token (int32 token + float32 logprob), the size of the proto's payload.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np

from impl.harness.client.config import (
    STORE_UNAVAILABLE,
    ClientConfig,
    Failure,
    prompt_for,
    store_unavailable,
)
from impl.harness.client.sdk_shaped import ClientProcess


class SdkClientProcess(ClientProcess):
    """The HTTP client process's bookkeeping and checks, with the SDK doing the HTTP."""

    async def run(self) -> dict[str, Any]:
        os.environ.setdefault("TINKER_TELEMETRY", "0")
        import tinker
        from tinker import types

        self._types = types
        config = self.config
        indices = range(*config.indices)
        started = time.monotonic()
        try:
            service = tinker.ServiceClient(base_url=config.url, api_key=config.api_key)
            self.sampler = await service.create_sampling_client(base_model=config.base_model)
        except Exception as exc:
            self.failed["sdk_setup"] += len(indices)
            self.examples.setdefault("sdk_setup", f"{type(exc).__name__}: {exc}"[:300])
            if self.progress is not None:
                self.progress[1], self.progress[2] = len(indices), 1
            return self.result(time.monotonic() - started)
        warm = [i for i in indices[: max(config.distinct_prompts, 1)] for _ in range(config.warmup)]
        await asyncio.gather(*(self.one_sdk(i) for i in warm))
        self.warmup = {"completed": self.completed, "failed": dict(self.failed)}
        self.completed, self.result_bytes, self.tokens = 0, 0, 0
        self.failed.clear()
        self.examples.clear()
        self.latencies.clear()
        if self.progress is not None:
            self.progress[0] = self.progress[1] = 0
            self.progress[2] = 1
        while self.go is not None and not self.go.is_set():
            await asyncio.sleep(0.01)
        started, cpu_started = time.monotonic(), time.process_time()
        pending = iter(indices)

        async def lane() -> None:
            for index in pending:
                await self.one_sdk(index)

        lanes = [
            asyncio.create_task(lane()) for _ in range(min(config.max_outstanding, len(indices)))
        ]
        _, not_done = await asyncio.wait(lanes, timeout=config.timeout)
        for task in not_done:
            task.cancel()
        await asyncio.gather(*not_done, return_exceptions=True)
        unfinished = len(indices) - self.completed - sum(self.failed.values())
        if unfinished > 0:
            self.failed["unfinished"] += unfinished
        wall = time.monotonic() - started
        return self.result(wall, time.process_time() - cpu_started)

    def result(self, wall: float, cpu: float = 0.0) -> dict[str, Any]:
        """The HTTP client process's result; the SDK's own requests are not counted here (the
        server's /healthz `polls` are), and `poll` is what client/config told the SDK."""
        out = super().result(wall, cpu)
        out.pop("requests", None)
        sampler = getattr(self, "sampler", None)
        if sampler is not None:
            session = sampler.holder.get_client_config().sample_use_retrieve_futures
            out["poll"] = "session" if session else "request"
        else:
            out.pop("poll", None)
        return out

    async def one_sdk(self, index: int) -> None:
        config, types = self.config, self._types
        prompt, seed = prompt_for(index, config)
        started = time.monotonic()
        try:
            try:
                response = await self.sampler.sample(
                    prompt=types.ModelInput.from_ints(prompt),
                    num_samples=config.num_samples,
                    sampling_params=types.SamplingParams(
                        max_tokens=config.max_tokens, seed=seed, temperature=1.0
                    ),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if store_unavailable(getattr(exc, "status_code", None), str(exc)):
                    raise Failure(STORE_UNAVAILABLE, str(exc)[:300]) from None
                raise Failure(f"sdk_{type(exc).__name__}", str(exc)[:300]) from None
            size = self._check_sdk(index, response)
        except Failure as failure:
            self._record_failure(failure)
            return
        self._record_success(started, size)

    def _check_sdk(self, index: int, response: Any) -> int:
        config = self.config
        sequences = response.sequences
        if len(sequences) != config.num_samples:
            raise Failure("wrong_result", f"{len(sequences)} sequences, asked {config.num_samples}")
        expected = self._expected_tokens(index) if config.verify == "exact" else None
        size = 0
        for k, seq in enumerate(sequences):
            tokens = np.asarray(seq.tokens, dtype=np.int32)
            if (k == 0 and len(tokens) != config.max_tokens) or len(tokens) > config.max_tokens:
                raise Failure(
                    "wrong_result", f"sequence {k}: {len(tokens)} tokens, asked {config.max_tokens}"
                )
            if seq.logprobs is not None and len(seq.logprobs) != len(tokens):
                raise Failure("wrong_result", f"sequence {k}: logprobs and tokens differ in length")
            if expected is not None and not np.array_equal(tokens, expected[k]):
                raise Failure(
                    "wrong_result", f"sequence {k}: tokens differ from what the router generated"
                )
            self.tokens += len(tokens)
            size += 8 * len(tokens)
        return size


def run_sdk_client_process(
    config: ClientConfig, progress: Any = None, go: Any = None
) -> dict[str, Any]:
    """Entry point of an SDK client process."""
    return asyncio.run(SdkClientProcess(config, progress, go).run())
