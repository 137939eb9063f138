-- events.sqlite as made by Vitrine at 838e4e5 (no vitrine_schema table; no client, sort, filters)
CREATE TABLE IF NOT EXISTS searches (
    query_id TEXT PRIMARY KEY, ts REAL NOT NULL, text TEXT, norm TEXT NOT NULL, ids TEXT NOT NULL,
    "offset" INTEGER NOT NULL DEFAULT 0, total INTEGER, image INTEGER NOT NULL DEFAULT 0,
    user_hash TEXT, session TEXT, experiment TEXT, variant TEXT
);
CREATE INDEX IF NOT EXISTS searches_ts ON searches(ts);
CREATE TABLE IF NOT EXISTS events (
    event_id TEXT PRIMARY KEY, query_id TEXT NOT NULL, type TEXT NOT NULL, product_id TEXT NOT NULL,
    position INTEGER NOT NULL, ts REAL NOT NULL, user_hash TEXT, session TEXT
);
CREATE INDEX IF NOT EXISTS events_ts ON events(ts);
CREATE INDEX IF NOT EXISTS events_query ON events(query_id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS experiments (name TEXT PRIMARY KEY, spec TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS experiment_teams (query_id TEXT PRIMARY KEY, experiment TEXT NOT NULL, teams TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS experiment_teams_exp ON experiment_teams (experiment);
CREATE INDEX IF NOT EXISTS searches_exp ON searches (experiment);

INSERT INTO meta VALUES ('user_key', '5f1d3a0c9b8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a392817060504');
INSERT INTO searches VALUES ('q-old-1', 1796500000.0, 'Red Shoes', 'red shoes', '["p1","p2","p3"]', 0, 3, 0,
                             'a1b2c3d4e5f6a7b8c9d0e1f2', 's-1', 'exp1', 'A');
INSERT INTO searches VALUES ('q-old-2', 1796500060.5, 'blue shirt', 'blue shirt', '[]', 0, 0, 0, NULL, 's-2', NULL, NULL);
INSERT INTO events VALUES ('e-old-1', 'q-old-1', 'click', 'p2', 1, 1796500010.0, 'a1b2c3d4e5f6a7b8c9d0e1f2', 's-1');
INSERT INTO events VALUES ('e-old-2', 'q-old-1', 'add_to_cart', 'p2', 1, 1796500020.0, 'a1b2c3d4e5f6a7b8c9d0e1f2', 's-1');
INSERT INTO events VALUES ('e-old-3', 'q-old-1', 'purchase', 'p2', 1, 1796500030.0, 'a1b2c3d4e5f6a7b8c9d0e1f2', 's-1');
INSERT INTO experiments VALUES ('exp1', '{"name":"exp1","variants":{"A":{},"B":{"learn_weight":0}},"split":[50,50]}', 1796499000.0);
