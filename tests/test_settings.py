"""Settings: one object, a section per layer, the same ``VITRINE_<FIELD>`` environment names."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from vitrine.settings import FIELD_SECTION, SECTIONS, Settings, settings_env


def test_every_field_is_read_from_its_environment_name(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("VITRINE_INDEX_FACTORY", " HNSW32 ")
    monkeypatch.setenv("VITRINE_KAFKA_TOPIC", "shop.catalog")
    monkeypatch.setenv("VITRINE_FUSION_SIGNALS", "bm25")
    monkeypatch.setenv("VITRINE_INTENT", "false")
    monkeypatch.setenv("VITRINE_API_KEY", "k")
    monkeypatch.setenv("VITRINE_DATA_DIR", str(tmp_path))
    s = Settings(_env_file=None)
    assert s.index.index_factory == "HNSW32" and s.ingest.kafka_topic == "shop.catalog"
    assert s.search.fusion_signals == ["bm25"] and s.intent.intent is False
    assert s.web.api_key == SecretStr("k") and s.storage.data_dir == tmp_path
    assert s.search.fusion_weights["bm25"] == 0.5  # defaults fill what the environment leaves out


def test_keywords_go_to_their_section_and_win_over_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("VITRINE_NPROBE", "4")
    monkeypatch.setenv("VITRINE_EF_SEARCH", "64")
    s = Settings(_env_file=None, nprobe=8, fusion="rrf", kafka_batch_size=4)
    assert (s.index.nprobe, s.index.ef_search, s.search.fusion, s.ingest.kafka_batch_size) == (8, 64, "rrf", 4)
    assert Settings(_env_file=None, intent=False).intent.intent is False  # the field, not the section
    with pytest.raises(TypeError, match="unknown setting"):
        Settings(_env_file=None, no_such_setting=1)
    with pytest.raises(ValueError):
        Settings(_env_file=None, fusion_signals="words")


def test_updated_copies_every_section() -> None:
    s = Settings(_env_file=None, data_dir=Path("/tmp/a"))
    t = s.updated(model="other", data_dir=Path("/tmp/b"))
    t.search.fusion = "off"
    assert (s.encoders.model, s.storage.data_dir, s.search.fusion) == ("effnetlite2-minilm", Path("/tmp/a"), "weighted")
    assert (t.encoders.model, t.storage.data_dir) == ("other", Path("/tmp/b"))


def test_settings_env_rebuilds_the_given_settings(monkeypatch) -> None:
    s = Settings(_env_file=None, index_factory="HNSW32", fusion_signals=["bm25"], api_key="x", workers=3,
                 fusion_weights={"bm25": 0.7})
    env = settings_env(s)
    assert env["VITRINE_INDEX_FACTORY"] == "HNSW32" and env["VITRINE_FUSION_SIGNALS"] == "bm25"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    again = Settings(_env_file=None)
    assert again.model_dump() == s.model_dump()


def test_field_names_are_unique_across_sections() -> None:
    assert len(FIELD_SECTION) == sum(len(c.model_fields) for c in SECTIONS.values())
    assert set(SECTIONS) == set(Settings.model_fields)
