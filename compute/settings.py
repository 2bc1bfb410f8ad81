"""Server settings, from the environment (KVX_*), so one image serves many deployments."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from limits import parse as parse_rate
from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVX_")

    site_dir: Path = Path("build/site")     # the built static site, served at /
    cors_origins: list[str] = []            # origins allowed to call the API (for embedding in other docs)
    max_body_bytes: int = 64 * 1024         # larger request bodies are refused with 413
    max_trace_body_bytes: int = 64 * 2 ** 20   # ... except to explainers that take a trace (50 MB of JSONL, escaped)
    explainer_trace_time_limit_s: float = 300.0   # an evaluation of an uploaded trace: the answer waits this long
    body_timeout_s: float = 30.0            # a request body must arrive within this of its headers (408)
    kernel_workers: int = 1                 # kernel jobs that run at once (the CPU has two cores)
    kernel_queue: int = 4                   # jobs that may wait; more get 503 with Retry-After
    kernel_per_client: int = 2              # queue places one client address may hold; more get 429
    kernel_time_limit_s: float = 300.0      # a job running longer is killed, with a clear error
    kernel_max_work: float = 2e11           # FLOP-equivalents one kernel request may cost; more is refused (422)
    kernel_max_bytes: float | None = None   # peak bytes one kernel request may need (None: kernel_specs.memory_budget)
    explainer_workers: int = 2              # uncached explainer evaluations that run at once, each in a process
    explainer_queue: int = 6                # evaluations that may wait; more get 503 with Retry-After
    explainer_per_client: int = 4           # places one client address may hold; more get 429
    explainer_rate_per_client: str = "20/second"   # new (uncached) evaluations one client address may ask for, in
    #                                                the `limits` notation ("20/second", "600/minute"); more get 429
    explainer_time_limit_s: float = 10.0    # an evaluation running longer is killed (422: ask for less)
    explainer_queue_seconds: float = 40.0   # estimated seconds of evaluations queued and running, at most
    explainer_wait_s: float = 25.0          # a request waits at most this for its answer, then 503 + Retry-After
    job_memory_bytes: int | None = -1       # address space one job may add (-1: half the memory free at start)
    job_start: Literal["fork", "spawn"] | None = None   # how kernel job processes start (None: spawn on CUDA, else fork)
    cache_bytes: int = 32 * 2 ** 20         # each result cache (explainers, kernels) holds at most this (JSON bytes)

    @field_validator("explainer_rate_per_client")
    @classmethod
    def _a_rate(cls, value: str) -> str:
        """Refused at start-up in a sentence, not at the first request."""
        try:
            parse_rate(value)
        except ValueError:
            raise ValueError(f"explainer_rate_per_client must be a rate such as '20/second' or '600/minute'; "
                             f"got {value!r}.") from None
        return value
