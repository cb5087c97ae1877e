-- Fair turns (app.fair): see the PostgreSQL migration of the same number.
-- weights: a JSON object of numbers; times in seconds since the epoch (REAL), as
-- the other tables keep them.
CREATE TABLE fair_queues (
    queue           text PRIMARY KEY,
    weights         text NOT NULL DEFAULT '{}',
    default_weight  real NOT NULL DEFAULT 1 CHECK (default_weight > 0),
    clock           real NOT NULL DEFAULT 0,
    aging_every     real CHECK (aging_every > 0),
    aging_step      integer NOT NULL DEFAULT 1,
    aging_cap       integer NOT NULL DEFAULT 0,
    updated_at      real
);

CREATE TABLE fair_turns (
    queue      text    NOT NULL,
    fair_key   text    NOT NULL,
    pass       real    NOT NULL,
    starts     integer NOT NULL DEFAULT 0,
    recent     real    NOT NULL DEFAULT 0,
    recent_at  real    NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, fair_key)
) WITHOUT ROWID;
