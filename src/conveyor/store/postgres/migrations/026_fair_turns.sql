-- Fair turns (app.fair): a fair queue's claims take ready jobs from its keys in
-- turn, weighted. One row per fair queue: the weights by key (JSON object of
-- numbers), the weight of a key not named, and the queue's clock, the turn the
-- last claim reached (a key that comes, or comes back, starts there: no credit
-- saved up while it had nothing queued). Aging, when set: a queued job's
-- priority counts aging_step more for every aging_every seconds it has been due,
-- up to aging_cap more, in the claim's order.
CREATE TABLE fair_queues (
    queue           text PRIMARY KEY,
    weights         jsonb            NOT NULL DEFAULT '{}',
    default_weight  double precision NOT NULL DEFAULT 1 CHECK (default_weight > 0),
    clock           double precision NOT NULL DEFAULT 0,
    aging_every     double precision CHECK (aging_every > 0),
    aging_step      integer          NOT NULL DEFAULT 1,
    aging_cap       integer          NOT NULL DEFAULT 0,
    updated_at      timestamptz      NOT NULL DEFAULT now()
);

-- Where each key's turn stands (pass: it has had its turns up to there; each job
-- started moves it on by 1/weight), and its starts: in all, and recent (decayed
-- with a one-minute time constant from recent_at), for the share shown to
-- operators. fair_key '' is the key of jobs without one (a key is never empty).
CREATE TABLE fair_turns (
    queue      text             NOT NULL,
    fair_key   text             NOT NULL,
    pass       double precision NOT NULL,
    starts     bigint           NOT NULL DEFAULT 0,
    recent     double precision NOT NULL DEFAULT 0,
    recent_at  timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, fair_key)
);
