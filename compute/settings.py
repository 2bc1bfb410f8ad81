"""Server settings, from the environment (KVX_*), so one image serves many deployments."""
from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVX_")

    site_dir: Path = Path("build/site")     # the built static site, served at /
    cors_origins: list[str] = []            # origins allowed to call the API (for embedding in other docs)
    max_body_bytes: int = 64 * 1024         # larger request bodies are refused with 413
    kernel_workers: int = 1                 # kernel jobs that run at once (the CPU has two cores)
    kernel_queue: int = 4                   # jobs that may wait; more get 503 with Retry-After
    kernel_time_limit_s: float = 300.0      # a job running longer is stopped with a clear error
    kernel_max_work: float = 2e11           # FLOP-equivalents one kernel request may cost; more is refused (422)
