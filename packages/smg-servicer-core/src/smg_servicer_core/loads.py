"""The servicer's own load estimate for ``GetLoads`` and load records.

- **Generation throughput**: output tokens streamed over a sliding window (2 s by default)
  divided by the window. Tokens are added in buckets of ``bucket_s`` so the memory is bounded
  (``window_s / bucket_s`` buckets) whatever the token rate.
- **Prefix-cache hit rate**: sum of cached prompt tokens over sum of prompt tokens, over the last
  64 requests that reported their first output.

Thread-safe: engines that run on their own thread may record directly. The clock is injectable so
tests do not sleep.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

THROUGHPUT_WINDOW_S = 2.0
HIT_RATE_SAMPLES = 64


@dataclass(frozen=True)
class LoadSnapshot:
    gen_throughput: float
    cache_hit_rate: float
    tokens_in_window: int


class LoadTracker:
    def __init__(
        self,
        window_s: float = THROUGHPUT_WINDOW_S,
        hit_rate_samples: int = HIT_RATE_SAMPLES,
        bucket_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0 or bucket_s <= 0 or hit_rate_samples <= 0:
            raise ValueError("window, bucket and sample count must be positive")
        self._window = window_s
        self._bucket = bucket_s
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: deque[tuple[int, int]] = deque()  # (bucket index, tokens)
        self._hits: deque[tuple[int, int]] = deque(maxlen=hit_rate_samples)

    def _expire(self, now_bucket: int) -> None:
        oldest = now_bucket - int(self._window / self._bucket)
        while self._buckets and self._buckets[0][0] <= oldest:
            self._buckets.popleft()

    def record_tokens(self, count: int) -> None:
        if count <= 0:
            return
        index = int(self._clock() / self._bucket)
        with self._lock:
            if self._buckets and self._buckets[-1][0] == index:
                self._buckets[-1] = (index, self._buckets[-1][1] + count)
            else:
                self._buckets.append((index, count))
                self._expire(index)

    def record_prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        if prompt_tokens <= 0:
            return
        with self._lock:
            self._hits.append((prompt_tokens, min(max(cached_tokens, 0), prompt_tokens)))

    def snapshot(self) -> LoadSnapshot:
        index = int(self._clock() / self._bucket)
        with self._lock:
            self._expire(index)
            tokens = sum(n for _, n in self._buckets)
            prompt = sum(p for p, _ in self._hits)
            cached = sum(c for _, c in self._hits)
        return LoadSnapshot(
            gen_throughput=tokens / self._window,
            cache_hit_rate=(cached / prompt) if prompt else 0.0,
            tokens_in_window=tokens,
        )
