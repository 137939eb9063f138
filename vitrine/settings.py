"""The one place configuration comes from: ``Settings``, one section per layer.

``Settings`` holds a section per layer (``settings.encoders``, ``.index``, ``.intent``,
``.search``, ``.swap``, ``.ingest``, ``.web``, ``.feedback``, and ``.storage`` for where data lives), each a
pydantic-settings class of its own. Every field can be set by an environment variable
``VITRINE_<FIELD>`` (e.g. ``VITRINE_INDEX_FACTORY=HNSW32``; field names are unique across the
sections), by a ``.env`` file, or by keyword: ``Settings(index_factory="HNSW32")`` routes each
keyword to its section (the CLI passes its options so). A leaf module every layer may import;
lower layers (encoders, index, intent) still take plain arguments where they can.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from vitrine import resources


TAXONOMY_VECTORS_FILE = "google-product-taxonomy.en-US.minilm.safetensors"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "vitrine"


# Hybrid ranking signals (vitrine/search/fusion.py) and their default weights, tuned on the val
# split's attribute and exact-word queries by `vitrine bench fusion` (README, "Knowledge graph").
FUSION_SIGNALS = ("native", "vector", "bm25", "graph:category", "graph:proximity", "graph:brand", "graph:colour",
                  "graph:gender", "graph:usage", "graph:season")
DEFAULT_FUSION_WEIGHTS = {"native": 0.0, "vector": 1.0, "bm25": 0.5, "graph:category": 0.5, "graph:proximity": 0.3,
                          "graph:brand": 0.3, "graph:colour": 0.3, "graph:gender": 0.5, "graph:usage": 0.3,
                          "graph:season": 0.03}
DEFAULT_RRF_WEIGHTS = {"native": 0.0, "vector": 1.0, "bm25": 2.0, "graph:category": 2.0, "graph:proximity": 0.0,
                       "graph:brand": 0.0, "graph:colour": 2.0, "graph:gender": 1.0, "graph:usage": 2.0,
                       "graph:season": 0.3}


class _Section(BaseSettings):
    """One layer's settings: environment ``VITRINE_<FIELD>``, a ``.env`` file, or keywords."""

    model_config = SettingsConfigDict(env_prefix="VITRINE_", env_file=".env", extra="ignore")
    title: ClassVar[str] = ""


class StorageSettings(_Section):
    """Where data lives: the data dir, the feature cache, the record store and its snapshots."""

    title: ClassVar[str] = "Where things live"

    data_dir: Path = Field(Path(".vitrine/data"), description="Data dir: records, photos, index snapshots.")
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Backbone feature cache.")
    store: str | None = Field(None, description="Record store: empty for SQLite in the data dir (one host), or a "
                              "postgresql://user:password@host:port/db URL shared by API replicas and ingest workers "
                              "on any hosts; the data dir then holds only rebuildable things (docs/postgresql.md).")
    snapshot_keep: int = Field(3, ge=1, le=100, description="Index snapshot versions kept in DIR/index/snapshots.")
    store_mirror: bool = Field(True, description="With a PostgreSQL store: keep a copy of the product documents in "
                               "the data dir (store-mirror.sqlite), so searches and product reads answer, marked "
                               "degraded, while the database is down (writes are refused; docs/postgresql.md).")

    @property
    def feature_cache_path(self) -> Path:
        return self.cache_dir / "features.sqlite"


class EncoderSettings(_Section):
    """The towers and aligner (vitrine/encoders), and the query fast path that runs them per query."""

    title: ClassVar[str] = "Models and query encoding"

    model: str = Field("effnetlite2-minilm", description="Tower config name/folder or open_clip architecture.")
    pretrained: str | None = Field(None, description="Local weights file of a full CLIP checkpoint.")
    adapter: str = Field("moe", description="Shipped adapter name or folder (config.json + model.safetensors).")
    device: str = Field("auto", description="auto | cpu | cuda")
    image_height: int | None = Field(None, ge=16, le=1024, description="Override the tower's input height.")
    image_width: int | None = Field(None, ge=16, le=1024, description="Override the tower's input width.")
    encode_batch_size: int = Field(64, ge=1, le=4096, description="Products encoded per forward when ingesting.")
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads (default: all cores).")
    batch_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="The text tower's precision when encoding products' texts in batches (ingest, "
        "re-embedding, training features, evals; photos stay fp32). auto: bf16 autocast where this machine's bf16 "
        "matrix products are at least 1.3x float32's (measured once per process), else fp32. Features match fp32's "
        "to a cosine of 0.9999 (bench-results/batch-precision.md).")
    query_cache_size: int = Field(4096, ge=0, le=10_000_000, description="LRU cache of query embeddings, keyed by "
                                  "model key + normalised text / photo SHA-256 (0: off).")
    query_batch_max: int = Field(32, ge=1, le=1024, description="Most concurrent queries encoded in one forward.")
    query_batch_wait_ms: float = Field(1.0, ge=0, le=100, description="How long a query waits for others to "
                                       "batch with (0: only those already queued).")
    query_text_precision: Literal["auto", "fp32", "bf16", "int8"] = Field(
        "auto", description="Text tower precision for queries only (product vectors are unchanged). auto: int8 "
        "where onnxruntime runs the text tower (quality holds: `vitrine bench fastpath`), else fp32.")
    query_runtime: Literal["auto", "torch", "onnx"] = Field(
        "auto", description="What runs the query text tower: onnxruntime (about 3x faster per short query, "
        "checked against torch at start-up), torch, or auto (onnxruntime when installed and the tower is "
        "fp32 on CPU).")
    query_threads: int = Field(1, ge=1, le=256, description="torch threads of each query encode worker: one "
                               "forward per core beats two threads contending on a busy CPU (measured).")
    max_image_bytes: int = Field(10_000_000, ge=1024, description="Largest photo accepted, in bytes.")
    max_image_pixels: int = Field(40_000_000, ge=1024, description="Largest photo accepted, in pixels "
                                  "(decompression bombs are refused).")

    @property
    def image_size(self) -> tuple[int, int] | None:
        if self.image_height and self.image_width:
            return (self.image_height, self.image_width)
        return None


class IndexSettings(_Section):
    """The vector indexes, BM25 and the knowledge graph (vitrine/index)."""

    title: ClassVar[str] = "Indexes"

    search_threads: int = Field(0, ge=0, le=256, description="Threads inside one search (FAISS OpenMP, "
                                "numpy/FAISS BLAS). 0: one when serving (requests already run side by side), "
                                "the libraries' default (all cores) for batch work.")
    vector_backend: Literal["faiss", "pgvector"] = Field(
        "faiss", description="Where vectors are searched: FAISS in each process (index_factory), or pgvector's HNSW "
                             "index in the PostgreSQL store (needs store=postgresql://...; docs/postgresql.md).")
    index_factory: str = Field("auto", description="FAISS factory string: auto (SQfp16 below 200,000 products, "
                               "IVF{4*sqrt(n)},Flat from there with nprobe raised until recall@10 vs exact search reaches 0.99 on the "
                               "catalogue's own rows, re-chosen at each snapshot; vitrine/index/index_choice.py), "
                               "SQfp16 (an exhaustive scan over float16 copies, hits scored again exactly: half Flat's "
                               "memory read per query), Flat (float32 scan; the one a GPU host searches on the GPU), "
                               "HNSW32, IVF{n},Flat, IVF{n},PQ{m}.")
    nprobe: int = Field(16, ge=1, description="IVF indexes: lists searched per query (recall vs speed).")
    mmap_indexes: bool = Field(True, description="Map snapshot vector files read-only instead of reading them into "
                               "memory: the processes serving one data dir on a host (serve --workers N) share one copy "
                               "of the vectors and FAISS codes; rows written since stay in each process's memory.")
    ef_search: int = Field(128, ge=1, description="HNSW indexes: search breadth per query (recall vs speed).")
    typo_tolerance: bool = Field(True, description="BM25 scores a query word no product holds as its closest "
                                                   "catalogue word (1 edit from 4 letters, 2 from 8).")
    graph_dir: Path = Field(default_factory=resources.graph_dir,
                            description="Graph data: category mapping, complements, colour rules, vocabulary, "
                                        "brand lexicon (default: shipped in the package).")
    taxonomy_file: Path = Field(default_factory=resources.taxonomy_file,
                                description="Google's product taxonomy, the category backbone (default: shipped).")
    taxonomy_vectors_file: Path = Field(
        default_factory=lambda: resources.resource_path("taxonomy", TAXONOMY_VECTORS_FILE),
        description="The text tower's vectors of the taxonomy's paths (made by `vitrine graph embed-taxonomy`; "
                    "default: shipped); recomputed once when missing or made by another tower.")
    taxonomy_map_threshold: float = Field(
        0.5, ge=0.0, le=1.0, description="Confidence below which a catalogue category stays off Google's "
                                         "taxonomy (its own node, no taxonomy proximity); docs/graph.md.")
    reembed_on_open: bool = Field(True, description="Opening a data dir re-embeds products whose vectors another "
                                                    "model made (after a model change), so none goes missing.")

    @field_validator("index_factory")
    @classmethod
    def _factory(cls, v: str) -> str:
        return v.strip()


class IntentSettings(_Section):
    """The intent classifier and its slots (vitrine/intent; vitrine/search/understanding.py)."""

    title: ClassVar[str] = "Query intent"

    intent: bool = Field(True, description="Classify each text query (Qwen2 intent classifier) and use its slots.")
    intent_model: str = Field("default", description="Shipped intent classifier name or folder "
                                                     "(config.json + model.safetensors).")
    intent_min_confidence: float = Field(0.6, ge=0.0, le=1.0, description="Below this probability the "
                                         "query is treated as a plain search.")
    intent_timeout_ms: float = Field(300.0, gt=0, description="Classifier time budget; past it the search "
                                                              "runs without intent (degraded: intent).")
    intent_answer_only_confidence: float = Field(0.9, ge=0.0, le=1.0, description="An after-sales query shows "
                                                 "its answer instead of products only at this probability or "
                                                 "above; under it, the answer comes with the products.")
    intent_slot_filters: bool = Field(True, description="Turn the slots a query names (brand, category, colour, "
                                                        "gender, price) into filters.")
    intent_vocab_refresh_s: float = Field(10.0, ge=0, description="Most often the slot vocabulary is rebuilt "
                                                                   "from the catalogue after it changed.")
    intent_classify_every_query: bool = Field(False, description="Run the classifier on queries the lexical prior "
                                              "already decides (no cue word of a non-search intent: a search), for "
                                              "their probabilities in the response; ~4 ms of CPU per query.")
    intent_threads: int = Field(1, ge=1, le=64, description="torch threads of the intent classifier's workers.")
    intent_members: int = Field(0, ge=0, le=9, description="Members of the intent ensemble to use: 0 = all shipped "
                                "(most accurate), 1 = the first only (less accurate, a little less CPU per query).")


class SearchSettings(_Section):
    """How a search ranks: hybrid fusion, the catalogue's calibration, pages and time budgets (vitrine/search)."""

    title: ClassVar[str] = "Search and ranking"

    query_image_weight: float = Field(
        0.4, ge=0.0, le=1.0, description="Weight of the photo when a query has both photo and text (chosen on val by "
        "`vitrine eval --protocol composed`)."
    )
    query_mix: Literal["gate", "fixed"] = Field(
        "fixed", description="Photo + words queries: always query_image_weight (fixed), or the MoE gate's modality "
        "gate weighs the photo per query (gate; adapters without one use query_image_weight). Chosen on val by "
        "`vitrine eval --protocol composed` (docs/models.md).")
    candidate_multiplier: int = Field(4, ge=1, le=100, description="Over-fetch factor for multi-signal ranking.")
    default_k: int = Field(10, ge=1, description="Results per search when the request gives no k.")
    max_k: int = Field(100, ge=1, le=10_000, description="Deepest result a search may ask for (offset + k); "
                                                          "it bounds the candidate pool a search ranks.")
    relevance_floor: float = Field(
        0.81, ge=0.0, le=1.0, description="Sorted and faceted searches count, sort and facet only the candidates "
        "scoring at least this fraction of the query's top score (tuned on val queries: "
        "bench-results/relevance_floor.md); a catalogue `vitrine tune` fitted its own floor for uses that one "
        "(relevance_floor_tuned).")
    relevance_floor_tuned: bool = Field(
        True, description="Use the relevance floor `vitrine tune` fitted to the catalogue's own score distributions "
        "(tuning.json) instead of relevance_floor (docs/tuning.md).")
    max_text_chars: int = Field(1000, ge=1, description="Longest query text accepted.")
    query_spelling: bool = Field(True, description="Read a query word the catalogue does not hold and the text tower "
                                 "does not know as the catalogue's closest word, or as two catalogue words it runs "
                                 "together, before every signal searches it (docs/api.md, Typo tolerance).")
    fusion: Literal["rrf", "weighted", "off"] = Field(
        "weighted", description="How vector, BM25 and graph signals fuse (weighted sum or reciprocal-rank); "
                                "off = vector ranking only. Weighted measured better (README).")
    fusion_signals: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["bm25", "graph"],
        description="Signals fused with the vectors: bm25, graph (comma-separated in the environment).")
    fusion_candidates: int = Field(100, ge=10, le=5000, description="Candidates each retriever adds to the pool.")
    fusion_weights: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_FUSION_WEIGHTS),
                                             description="Weights of the weighted fusion, per signal.")
    rrf_weights: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_RRF_WEIGHTS),
                                          description="Weights of reciprocal-rank fusion, per signal.")
    rrf_k: float = Field(10.0, gt=0, description="Reciprocal-rank fusion constant: weight / (rrf_k + rank).")
    calibration: Literal["auto", "floor", "off"] = Field(
        "auto", description="How text-only queries rank: auto = the weights `vitrine tune` fitted to this catalogue "
                            "while they fit it, else the floor (the text tower's own cosine ranking); floor = "
                            "always the floor; off = the configured fusion weights, as for queries with a photo "
                            "(docs/tuning.md).")
    tune_max_drift: float = Field(0.1, ge=0.0, le=1.0, description="A tuning stays in use until this share of "
                                  "the catalogue's products changed since it was fitted; past it, the floor.")
    tune_after_ingest: bool = Field(True, description="Run `vitrine tune` after `vitrine ingest` when it is cheap "
                                    "(catalogue of at most tune_auto_max_products products).")
    tune_taxonomy_queries: int = Field(200, ge=0, le=100_000, description="Pseudo-queries naming the Google-"
                                       "taxonomy nodes the catalogue's categories map to, in other words than the "
                                       "records', that `vitrine tune` fits on beside the records' own (0: none; "
                                       "docs/tuning.md).")
    tune_kind_penalty: float = Field(3.0, ge=0.0, le=100.0, description="`vitrine tune`: a mix's loss to the floor "
                                     "on one kind of pseudo-query costs this many times what a gain on another earns, "
                                     "and a mix losing on a held-out kind is shrunk toward the floor (0: the plain "
                                     "mean over kinds; docs/tuning.md).")
    tune_samples: int = Field(5, ge=1, le=20, description="Samples of pseudo-queries `vitrine tune` fits apart "
                              "(each from its own seed), serving the mean of their mixes: one sample's fit swings "
                              "with the queries drawn (docs/tuning.md). Each costs one more pass of pool building.")
    tune_auto_max_products: int = Field(100_000, ge=0, description="Largest catalogue tuned automatically after "
                                        "an ingest (tune's cost grows with the catalogue: ~2 min at 20k products "
                                        "on 2 quiet cores, five samples).")
    mmr_lambda: float = Field(0.7, ge=0.0, le=1.0, description="Similar items: relevance vs diversity (MMR).")
    gate_timeout_ms: float = Field(2000.0, gt=0, description="Query embedding (adapter/MoE gate) time budget; "
                                                             "past it the search degrades (degraded: gate).")
    fusion_timeout_ms: float = Field(2000.0, gt=0, description="Hybrid fusion time budget; past it (or when "
                                     "fusion fails) the search is the plain vector ranking (degraded: fusion).")
    out_of_stock: Literal["last", "hide"] = Field(
        "last", description="Out-of-stock products (in_stock false or quantity 0): last = after the in-stock ones "
                            "that match, hide = left out; a merchandising rule may say otherwise per query "
                            "(docs/merchandising.md).")
    max_rules: int = Field(20_000, ge=0, description="Most merchandising rules the store accepts (a put past it "
                                                      "is refused).")
    rules_refresh_s: float = Field(0.5, ge=0.0, le=60.0, description="How often at most a process checks the "
                                   "rule store for changes other processes made (a cheap version read).")

    session_ttl_s: float = Field(1800.0, gt=0, description="A shopping session (the `session` of a search) expires "
                                 "this many seconds after its last search; a later search in it is a new search.")
    session_max: int = Field(100_000, ge=1, description="Most sessions kept; past it the least recently used go.")
    session_store: Literal["auto", "memory"] = Field(
        "auto", description="Where sessions live: auto = beside the record store (sessions.sqlite in the data dir, "
                            "or the PostgreSQL store's vitrine_sessions table), shared by every worker and replica; "
                            "memory = this process only (docs/sessions.md).")
    @field_validator("fusion_signals", mode="before")
    @classmethod
    def _signals(cls, v: Any) -> list[str]:
        if isinstance(v, str):
            v = json.loads(v) if v.strip().startswith("[") else [x for x in v.split(",")]
        out = [str(x).strip().lower() for x in v if str(x).strip() and str(x).strip().lower() != "none"]
        bad = [x for x in out if x not in ("bm25", "graph")]
        if bad:
            raise ValueError(f"unknown fusion signal(s) {bad}; use bm25, graph (or none)")
        return out

    @field_validator("fusion_weights", "rrf_weights", mode="after")
    @classmethod
    def _weights(cls, v: dict[str, float], info: Any) -> dict[str, float]:
        bad = [k for k in v if k not in FUSION_SIGNALS]
        if bad:
            raise ValueError(f"unknown signal(s) {bad}; known: {list(FUSION_SIGNALS)}")
        if any(w < 0 for w in v.values()):
            raise ValueError("fusion weights must not be negative")
        base = DEFAULT_FUSION_WEIGHTS if info.field_name == "fusion_weights" else DEFAULT_RRF_WEIGHTS
        return {**base, **v}


class SwapSettings(_Section):
    """Hot swaps of the model or index and their canary checks (vitrine/search/swap.py)."""

    title: ClassVar[str] = "Hot swap"

    follow_swap: bool = Field(True, description="Open a data dir with the model its last hot swap activated "
                                                "(DIR/index/active_model.json) instead of the configured one.")
    canary_size: int = Field(64, ge=4, le=5000, description="Catalogue products whose titles and photos are "
                                                            "the canary queries of a hot swap.")
    canary_queries: Path | None = Field(None, description="Extra canary queries: JSONL of {\"text\": ...}.")
    canary_k: int = Field(10, ge=1, le=100, description="Results compared per canary query.")
    swap_min_overlap: float = Field(0.9, ge=0.0, le=1.0, description="Same model: least mean overlap@k of "
                                                                      "candidate and live canary results.")
    swap_min_agreement: float = Field(0.99, ge=-1.0, le=1.0, description="Same model: least mean cosine of "
                                                                         "candidate and live embeddings.")
    swap_model_min_overlap: float = Field(0.2, ge=0.0, le=1.0, description="New model: least mean overlap@k "
                                                                             "with the live model's results.")
    swap_model_min_agreement: float = Field(0.4, ge=-1.0, le=1.0, description="New model: least mean rank "
                                          "correlation of candidate and live similarity to the canary probes.")
    swap_max_recall_drop: float = Field(0.1, ge=0.0, le=1.0, description="Most the canary's known-item "
                                                                        "recall@k may fall below the live one.")


class IngestSettings(_Section):
    """Catalogue ingest: photo fetching and the Kafka catalogue stream (vitrine/ingest)."""

    title: ClassVar[str] = "Ingest and the Kafka stream"

    fetch_timeout_s: float = Field(10.0, gt=0, description="Timeout of fetching a photo URL.")
    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Bootstrap servers, comma-separated host:port.")
    kafka_topic: str = Field("vitrine.catalog", description="Topic of catalogue change events.")
    kafka_group: str = Field("vitrine-ingest", description="Consumer group of the ingest workers.")
    kafka_dlq_topic: str | None = Field(None, description="Dead-letter topic (default: <topic>.dlq).")
    kafka_partitions: int = Field(6, ge=1, description="Partitions of topics Vitrine creates itself.")
    kafka_replication: int = Field(1, ge=1, description="Replication factor of topics Vitrine creates.")
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="How clients talk to the brokers.")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism (SASL_PLAINTEXT, SASL_SSL).")
    kafka_sasl_username: str | None = Field(None, description="SASL user name.")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password.")
    kafka_ssl_cafile: Path | None = Field(None, description="CA bundle to verify the brokers (SSL, SASL_SSL).")
    kafka_ssl_certfile: Path | None = Field(None, description="Client certificate (mutual TLS).")
    kafka_ssl_keyfile: Path | None = Field(None, description="Client private key (mutual TLS).")
    kafka_ssl_check_hostname: bool = Field(True, description="Check the brokers' certificate host names.")
    kafka_session_timeout_ms: int = Field(6000, ge=500, description="Group session timeout: how fast a dead "
                                                                    "worker's partitions move to the others.")
    kafka_max_poll_interval_ms: int = Field(120_000, ge=1000, description="Longest one batch may take before "
                                                                          "the group drops the worker.")
    kafka_batch_size: int = Field(64, ge=1, le=10_000, description="Most events one ingest batch applies.")
    kafka_poll_timeout_ms: int = Field(500, ge=10, le=60_000, description="How long one poll waits for events.")
    kafka_snapshot_interval_s: float = Field(60.0, ge=0, description="Index snapshot cadence of a worker "
                                                                      "(0: after every batch).")
    kafka_photo_root: Path | None = Field(None, description="Folder that local photo paths in events resolve "
                                                            "against; unset: only image_b64 and URLs.")


class WebSettings(_Section):
    """The HTTP API (vitrine/web): binding, workers, limits, time budgets."""

    title: ClassVar[str] = "Service"

    host: str = Field("127.0.0.1", description="Address the API binds.")
    port: int = Field(8000, ge=0, le=65535, description="Port the API listens on.")
    api_key: SecretStr | None = Field(None, description="Required for writes (PUT/DELETE /products).")
    events_key: SecretStr | None = Field(None, description="A key that may only post shopper events "
                                         "(POST /v1/events), safe to give a browser; the write key works too.")
    cors_origins: list[str] = Field(default_factory=list, description="CORS allowed origins; empty = CORS off.")
    log_level: str = Field("INFO", description="Log level: DEBUG, INFO, WARNING, ERROR.")
    workers: int = Field(1, ge=1, le=64, description="API worker processes (`vitrine serve`). One Python process "
                         "tops out near one core (the interpreter lock). With more than one, the data dir's "
                         "indexes are opened once and the workers are forked from that process (gunicorn), "
                         "sharing them copy-on-write; each loads its own models (torch single-threaded unless "
                         "torch_threads says otherwise) and follows the data dir (follow_s), so a write "
                         "through one is seen by all. Hot swap needs a single worker.")
    follow_s: float = Field(0.0, ge=0, description="The API picks up other processes' writes to its data dir this "
                                                   "often (0: never; 1 s when workers > 1; 0.5 s with a "
                                                   "PostgreSQL store).")
    tune_malloc: bool = Field(True, description="The API fixes glibc's malloc thresholds so big, short-lived "
                                                "buffers (index snapshots) go back to the OS (vitrine/web/memory.py).")
    snapshot_interval_s: float = Field(30.0, ge=0, description="The API snapshots its indexes this often when "
                                                                "they changed (0: after every write).")
    search_concurrency: int = Field(0, ge=0, le=1024, description="Searches one API process runs at once; "
                                    "later ones wait their turn, first come first served. 0: no limit (the "
                                    "server's thread pool, 40). 2 shortened text tails on a tuned catalogue "
                                    "but cost photo throughput (bench-results/search-concurrency).")
    side_work_nice: int = Field(10, ge=0, le=19, description="How much lower than searches the API runs its side "
                                "work (analytics reads, experiment reports, learning, retention) and its intake "
                                "of shopper events (in side processes or on threads of their own): a nice increment "
                                "(Linux, per thread; 0: the same priority). Searches then get the CPU first while a "
                                "dashboard polls analytics (vitrine/web/sidework.py).")
    side_work_idle: bool = Field(True, description="Run the API's side work and the intake of shopper events "
                                 "in the kernel's idle scheduling class too (Linux SCHED_IDLE, per thread or side process): they "
                                 "take only the CPU searches leave, where nice 19 still takes a share "
                                 "(bench-results/side-work.md).")
    side_work_duty: float = Field(0.25, gt=0, le=1, description="The most of one core the API's side work "
                                  "(analytics reads, experiment reports, learning, retention) takes when asked back "
                                  "to back: a job that used c s of CPU is followed by c * (1 / duty - 1) s of rest "
                                  "(at most 1 s) before the next starts (1: no rest). A dashboard polling analytics in a loop "
                                  "then waits its turn instead of slowing searches; a single read answers at once. "
                                  "The intake of events is never paced.")
    side_work_process: bool = Field(True, description="Store shopper events and build analytics reports in a "
                                    "process of their own each (spawned on first use, lowered and paced like the side "
                                    "work): they then never hold the interpreter lock searches need "
                                    "(vitrine/web/sideproc.py, bench-results/side-process.md). Off: on the API's own threads.")
    max_body_bytes: int = Field(16_000_000, ge=1024, description="Largest request body the API accepts.")
    request_timeout_s: float = Field(30.0, gt=0, description="Longest an API request may run (504 after).")
    admin_timeout_s: float = Field(3600.0, gt=0, description="Longest an admin action (hot swap) may run.")
    rate_search_per_minute: float = Field(12000.0, ge=0, description="Searches (POST /v1/search, /v1/search/image) "
                                          "one client (address and user agent) or one key may make a minute; "
                                          "past it: 429 with Retry-After (0: no limit). The default stops a "
                                          "flood, not a load test at 100/s; calls with the write key are never "
                                          "limited per client (a shop's own server speaks for many shoppers).")
    rate_events_per_minute: float = Field(6000.0, ge=0, description="POST /v1/events calls one client or key may "
                                          "make a minute (0: no limit).")
    rate_suggest_per_minute: float = Field(12000.0, ge=0, description="GET /v1/suggest calls one client or key "
                                           "may make a minute (0: no limit).")
    rate_key_per_minute: float = Field(0.0, ge=0, description="Calls to those routes one key (the write key, the "
                                       "events key) may make a minute, over all its clients; 0 (default): no "
                                       "per-key limit, as the events key is every browser's. A scoped key "
                                       "carries its own rate (`vitrine keys create --rate`).")


class FeedbackSettings(_Section):
    """What the API hears from shoppers (vitrine/feedback/intake.py): searches and events logged,
    and how ranking learns from them (`vitrine tune`)."""

    title: ClassVar[str] = "Shopper feedback"

    log_searches: bool = Field(True, description="Log every API search (its query_id, text, page) so events "
                                                 "can name it; off: responses carry no query_id.")
    events_retention_days: float = Field(90.0, gt=0, description="Searches and events older than this are "
                                         "forgotten; events on them are refused.")
    events_purge_interval_s: float = Field(3600.0, ge=0, description="How often a serving process forgets what is "
                                           "older than events_retention_days (0: only `vitrine events purge`).")
    events_max_batch: int = Field(1000, ge=1, le=100_000, description="Most events one POST /v1/events takes.")
    learn_min_users: int = Field(3, ge=1, description="A query needs clicks from this many distinct users before "
                                 "it gets a learned re-ranking; a product needs them too before it is boosted.")
    learn_half_life_days: float = Field(30.0, gt=0, description="Evidence halves in weight every this many days.")
    learn_weight: float = Field(1.0, ge=0, description="How strongly learned per-query evidence re-ranks a logged "
                                "query's results (0: off).")
    learn_propensity: Literal["prior", "em"] = Field("prior", description="How likely shoppers examine each rank: "
                                                     "prior = 1/(rank+1); em = fitted by EM where the log shows a "
                                                     "product at several ranks for reasons of their own (interleaving, "
                                                     "randomised pages; docs/learning.md).")
    learn_interval_s: float = Field(0.0, ge=0, description="The API learns from the search log this often when "
                                    "new events arrived; 0 (default): only `vitrine tune` learns, outside the API "
                                    "(docs/learning.md says why).")
    learn_max_queries: int = Field(10_000, ge=0, description="Most head queries that keep a learned re-ranking.")
    learn_rocchio_weight: float = Field(1.0, ge=0, description="How far a logged query's ranking moves toward "
                                        "products like the ones its shoppers chose, shown or not (Rocchio "
                                        "feedback in the text tower's space; 0: off; docs/learning.md).")
    learn_ranker: bool = Field(True, description="Train a learned ranker (LightGBM lambdarank over the fusion's "
                               "signals and the log's features, inverse-propensity weighted clicks) with each learn; "
                               "served only when it beats the table alone, what serves and the text tower on the "
                               "later slice of the log (docs/learning.md).")
    learn_category_weight: float = Field(0.0, ge=0, description="How much a logged query's chosen categories lift "
                                         "their other products (0, default: off; it lost on the dev set, docs/learning.md).")
    explore_share: float = Field(0.05, ge=0, le=1, description="Share of head-query first pages that show one "
                                 "product from ranks 11-50 at a logged propensity, so the log learns what lies "
                                 "below the page (0: off for this catalogue).")
    explore_head_searches: int = Field(10, ge=1, description="A query is a head query for exploration once this "
                                       "process answered it this often (or the learned table holds it).")
    learn_transfer_similarity: float = Field(0.8, ge=0, le=1, description="A query nobody logged borrows what its "
                                             "nearest logged query learned when their text vectors' cosine reaches "
                                             "this (1: never).")
    learn_client_share: float = Field(0.2, gt=0, le=1, description="Most share of a query's evidence one client "
                                      "(hashed address and user agent) counts for, whatever user tokens it sends "
                                      "(docs/learning.md, Abuse).")
    bot_events_per_minute: int = Field(60, ge=0, description="A client that posts more events than this in a "
                                       "minute is a bot: learning and suggestions ignore it, analytics counts "
                                       "it (0: no filter).")
    learn_min_judged: int = Field(5, ge=1, description="A learned table replaces what serves only when judged on "
                                  "at least this many queries of the later slice of the log.")
    learn_alpha: float = Field(0.05, gt=0, le=1, description="...and only when the paired randomisation test over "
                               "those queries' nDCG@10 (learned vs serving, one-sided, on the mean difference) is below "
                               "this p-value (1: no test, a higher mean is enough).")
    suggest_min_clients: int = Field(3, ge=1, description="A logged query becomes a suggestion only once this many "
                                     "distinct clients chose a result of it (never a bot's).")


class Settings(BaseModel):
    """Every setting, one section per layer. Keywords are the fields' names (flat), or a
    section (an instance or a dict); ``_env_file`` is the ``.env`` file read (None: none)."""

    storage: StorageSettings = Field(default_factory=StorageSettings, description="Where things live.")
    encoders: EncoderSettings = Field(default_factory=EncoderSettings, description="Models and query encoding.")
    index: IndexSettings = Field(default_factory=IndexSettings, description="Indexes.")
    intent: IntentSettings = Field(default_factory=IntentSettings, description="Query intent.")
    search: SearchSettings = Field(default_factory=SearchSettings, description="Search and ranking.")
    swap: SwapSettings = Field(default_factory=SwapSettings, description="Hot swap.")
    ingest: IngestSettings = Field(default_factory=IngestSettings, description="Ingest and the Kafka stream.")
    web: WebSettings = Field(default_factory=WebSettings, description="Service.")
    feedback: FeedbackSettings = Field(default_factory=FeedbackSettings, description="Shopper feedback.")

    def __init__(self, _env_file: str | Path | None = ".env", **kw: Any) -> None:
        # a section given whole (an instance or a dict); ``intent=False`` is the field, not the section
        given = {k: kw.pop(k) for k in list(kw) if k in SECTIONS and isinstance(kw[k], (dict, _Section))}
        routed = route(kw)
        built: dict[str, _Section] = {}
        for name, cls in SECTIONS.items():
            g, over = given.get(name), routed.get(name, {})
            if isinstance(g, cls):
                built[name] = g.model_copy(update=over) if over else g
            else:
                built[name] = cls(_env_file=_env_file, **{**(g or {}), **over})
        super().__init__(**built)

    def updated(self, **changes: Any) -> "Settings":
        """A copy with these fields (flat names) changed; every section is copied."""
        routed = route(changes)
        return Settings(**{name: getattr(self, name).model_copy(update=routed.get(name, {}), deep=True)
                           for name in SECTIONS})


SECTIONS: dict[str, type[_Section]] = {
    "storage": StorageSettings, "encoders": EncoderSettings, "index": IndexSettings, "intent": IntentSettings,
    "search": SearchSettings, "swap": SwapSettings, "ingest": IngestSettings, "web": WebSettings,
    "feedback": FeedbackSettings,
}
FIELD_SECTION: dict[str, str] = {f: name for name, cls in SECTIONS.items() for f in cls.model_fields}
assert len(FIELD_SECTION) == sum(len(c.model_fields) for c in SECTIONS.values()), "a field name in two sections"


def route(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Flat field names -> {section: {field: value}}; an unknown name is a TypeError."""
    out: dict[str, dict[str, Any]] = {}
    unknown = [k for k in flat if k not in FIELD_SECTION]
    if unknown:
        raise TypeError(f"unknown setting(s) {unknown}")
    for k, v in flat.items():
        out.setdefault(FIELD_SECTION[k], {})[k] = v
    return out


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings given explicitly, as the ``VITRINE_*`` environment that rebuilds them in
    another process (``serve --workers``: uvicorn starts each worker fresh)."""
    from pydantic_core import to_jsonable_python

    out: dict[str, str] = {}
    for section in SECTIONS:
        part = getattr(settings, section)
        for name in part.model_fields_set:
            value = getattr(part, name)
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if isinstance(value, (str, Path)):
                text = str(value)
            elif name == "fusion_signals":  # NoDecode: comma-separated
                text = ",".join(value)
            else:
                text = json.dumps(to_jsonable_python(value))
            out[f"VITRINE_{name.upper()}"] = text
    return out
