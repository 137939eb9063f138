-- the rules table of records.sqlite as made by Vitrine at 838e4e5 (no vitrine_schema table)
CREATE TABLE IF NOT EXISTS rules (
    id TEXT PRIMARY KEY,
    body TEXT,
    enabled INTEGER NOT NULL DEFAULT 1,
    updated REAL NOT NULL,
    seq INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rules_seq ON rules(seq);

INSERT INTO rules VALUES ('boost-red', '{"boost":[{"ids":["p1"],"weight":2.0}],"when":{"query":"red"}}', 1, 1796400000.0, 1, 0);
INSERT INTO rules VALUES ('old-sale', NULL, 1, 1796400100.0, 3, 1);
INSERT INTO rules VALUES ('pin-blue', '{"pin":[{"id":"p9","position":1}],"when":{"query":"blue shirt"}}', 0, 1796400050.0, 2, 0);
