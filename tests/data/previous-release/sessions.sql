-- sessions.sqlite as made by Vitrine at 838e4e5 (no vitrine_schema table)
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    vec BLOB,
    touched REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_touched ON sessions(touched);

INSERT INTO sessions VALUES ('s-old', '{"turn":2,"words":["black","shoes"],"slots":{"colour":["Black"]}}',
                             X'0000803F00000040', 4102444800.0);
