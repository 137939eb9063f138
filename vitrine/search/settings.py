"""The one place configuration comes from: ``Settings`` (pydantic-settings).

Every field can be set by an environment variable ``VITRINE_<FIELD>`` (e.g.
``VITRINE_INDEX_FACTORY=HNSW32``), by a ``.env`` file, or by the CLI, which passes its
options as overrides. Lower layers (encoders, index, intent) never read settings: the
engine hands them plain arguments.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "vitrine"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VITRINE_", env_file=".env", extra="ignore")

    # -- where things live ------------------------------------------------------------------
    data_dir: Path = Field(Path(".vitrine/data"), description="Data dir: records, photos, index snapshots.")
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Backbone feature cache.")

    # -- models -------------------------------------------------------------------------------
    model: str = Field("effnetlite2-minilm", description="Tower config name/folder or open_clip architecture.")
    pretrained: str | None = Field(None, description="Local weights file of a full CLIP checkpoint.")
    adapter: str = Field("mlp", description="Shipped adapter name or folder (config.json + model.safetensors).")
    device: str = Field("auto", description="auto | cpu | cuda")
    image_height: int | None = Field(None, ge=16, le=1024, description="Override the tower's input height.")
    image_width: int | None = Field(None, ge=16, le=1024, description="Override the tower's input width.")
    encode_batch_size: int = Field(64, ge=1, le=4096)
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads (default: all cores).")

    # -- index and ranking --------------------------------------------------------------------
    index_factory: str = Field("Flat", description="FAISS factory string: Flat, HNSW32, IVF{n},Flat, IVF{n},PQ{m}.")
    nprobe: int = Field(16, ge=1)
    ef_search: int = Field(128, ge=1)
    query_image_weight: float = Field(
        0.5, ge=0.0, le=1.0, description="Weight of the photo when a query has both photo and text."
    )
    candidate_multiplier: int = Field(4, ge=1, le=100, description="Over-fetch factor for multi-signal ranking.")
    default_k: int = Field(10, ge=1)
    max_k: int = Field(100, ge=1, le=10_000)

    # -- input limits ---------------------------------------------------------------------------
    max_image_bytes: int = Field(10_000_000, ge=1024)
    max_image_pixels: int = Field(40_000_000, ge=1024)
    max_text_chars: int = Field(1000, ge=1)
    max_body_bytes: int = Field(16_000_000, ge=1024)
    fetch_timeout_s: float = Field(10.0, gt=0)

    # -- service ----------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: SecretStr | None = Field(None, description="Required for writes (PUT/DELETE /products).")
    cors_origins: list[str] = Field(default_factory=list, description="CORS allowed origins; empty = CORS off.")
    log_level: str = "INFO"

    @field_validator("index_factory")
    @classmethod
    def _factory(cls, v: str) -> str:
        return v.strip()

    @property
    def image_size(self) -> tuple[int, int] | None:
        if self.image_height and self.image_width:
            return (self.image_height, self.image_width)
        return None

    @property
    def feature_cache_path(self) -> Path:
        return self.cache_dir / "features.sqlite"
