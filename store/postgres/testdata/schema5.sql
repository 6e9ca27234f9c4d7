--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: {{schema}}; Type: SCHEMA; Schema: -; Owner: -
--



SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: activity; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.activity (
    minute bigint NOT NULL,
    task text NOT NULL,
    kind text NOT NULL,
    n bigint NOT NULL
);


--
-- Name: assignments; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.assignments (
    work_id text NOT NULL,
    run integer NOT NULL,
    executor text NOT NULL,
    task text NOT NULL,
    start_by bigint NOT NULL,
    timeout_ns bigint NOT NULL,
    state integer DEFAULT 0 NOT NULL,
    cancel text,
    started_at bigint DEFAULT 0 NOT NULL,
    ending bytea
)
WITH (fillfactor='50');


--
-- Name: dependencies; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.dependencies (
    n bigint NOT NULL,
    unit_id text NOT NULL,
    depends_on text NOT NULL
);


--
-- Name: dependencies_n_seq; Type: SEQUENCE; Schema: {{schema}}; Owner: -
--

CREATE SEQUENCE {{schema}}.dependencies_n_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: dependencies_n_seq; Type: SEQUENCE OWNED BY; Schema: {{schema}}; Owner: -
--

ALTER SEQUENCE {{schema}}.dependencies_n_seq OWNED BY {{schema}}.dependencies.n;


--
-- Name: event_blocks; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.event_blocks (
    last bigint NOT NULL,
    first bigint NOT NULL,
    min_at bigint NOT NULL,
    max_at bigint NOT NULL,
    data bytea NOT NULL
);


--
-- Name: event_ranges; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.event_ranges (
    n bigint NOT NULL,
    task text NOT NULL,
    type text NOT NULL,
    first bigint NOT NULL,
    last bigint NOT NULL
);


--
-- Name: event_ranges_n_seq; Type: SEQUENCE; Schema: {{schema}}; Owner: -
--

CREATE SEQUENCE {{schema}}.event_ranges_n_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: event_ranges_n_seq; Type: SEQUENCE OWNED BY; Schema: {{schema}}; Owner: -
--

ALTER SEQUENCE {{schema}}.event_ranges_n_seq OWNED BY {{schema}}.event_ranges.n;


--
-- Name: executors; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.executors (
    id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    tasks text NOT NULL,
    capacity integer NOT NULL,
    poll_ns bigint NOT NULL,
    ttl_ns bigint NOT NULL,
    registered_at bigint NOT NULL,
    seen_at bigint NOT NULL
);


--
-- Name: meta; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.meta (
    key text NOT NULL,
    value bigint NOT NULL
);


--
-- Name: meter_state; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.meter_state (
    service text NOT NULL,
    meter text NOT NULL,
    state bytea NOT NULL
);


--
-- Name: owner_lease; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.owner_lease (
    id integer NOT NULL,
    epoch bigint NOT NULL,
    holder text,
    expires_at timestamp with time zone,
    CONSTRAINT owner_lease_id_check CHECK ((id = 1))
);


--
-- Name: questions; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.questions (
    id text NOT NULL,
    question bytea NOT NULL,
    asked_at bigint NOT NULL,
    answer bytea
);


--
-- Name: queue_wait; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.queue_wait (
    minute bigint NOT NULL,
    bucket integer NOT NULL,
    n bigint NOT NULL
);


--
-- Name: runcue_schema; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.runcue_schema (
    version integer NOT NULL
);


--
-- Name: schedules; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.schedules (
    name text NOT NULL COLLATE pg_catalog."C",
    def bytea NOT NULL,
    timing bytea,
    paused boolean DEFAULT false NOT NULL,
    created_at bigint NOT NULL,
    last_at bigint NOT NULL,
    last_key text DEFAULT ''::text NOT NULL COLLATE pg_catalog."C",
    last_unit text DEFAULT ''::text NOT NULL
);


--
-- Name: service_log; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.service_log (
    n bigint NOT NULL,
    service text NOT NULL COLLATE pg_catalog."C",
    started_at bigint NOT NULL,
    work_id text,
    meter text DEFAULT 'requests'::text NOT NULL,
    amount bigint DEFAULT 1 NOT NULL,
    reconciled boolean DEFAULT false NOT NULL
);


--
-- Name: service_log_n_seq; Type: SEQUENCE; Schema: {{schema}}; Owner: -
--

CREATE SEQUENCE {{schema}}.service_log_n_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: service_log_n_seq; Type: SEQUENCE OWNED BY; Schema: {{schema}}; Owner: -
--

ALTER SEQUENCE {{schema}}.service_log_n_seq OWNED BY {{schema}}.service_log.n;


--
-- Name: services; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.services (
    name text NOT NULL,
    def bytea,
    override bytea,
    paused boolean DEFAULT false NOT NULL
);


--
-- Name: subscriptions; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.subscriptions (
    name text NOT NULL,
    acked bigint NOT NULL,
    created_at bigint NOT NULL,
    acked_at bigint DEFAULT 0 NOT NULL,
    types text DEFAULT ''::text NOT NULL,
    tasks text DEFAULT ''::text NOT NULL
);


--
-- Name: tasks; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.tasks (
    name text NOT NULL,
    def bytea NOT NULL,
    paused boolean DEFAULT false NOT NULL
);


--
-- Name: unit_counts; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.unit_counts (
    task text NOT NULL,
    state text NOT NULL,
    n bigint NOT NULL
);


--
-- Name: work_units; Type: TABLE; Schema: {{schema}}; Owner: -
--

CREATE TABLE {{schema}}.work_units (
    seq bigint NOT NULL,
    id text NOT NULL,
    task text NOT NULL,
    target text DEFAULT ''::text NOT NULL,
    params bytea,
    state text NOT NULL,
    runs integer DEFAULT 0 NOT NULL,
    failures integer DEFAULT 0 NOT NULL,
    deferrals integer DEFAULT 0 NOT NULL,
    created_at bigint NOT NULL,
    run_at bigint DEFAULT 0 NOT NULL,
    started_at bigint DEFAULT 0 NOT NULL,
    finished_at bigint DEFAULT 0 NOT NULL,
    timeout bigint DEFAULT 0 NOT NULL,
    leased_by text,
    lease_expires_at bigint DEFAULT 0 NOT NULL,
    heartbeat_at bigint DEFAULT 0 NOT NULL,
    result bytea,
    error text,
    error_kind text,
    idempotency_key text,
    dependency_deadline bigint DEFAULT 0 NOT NULL,
    retry bytea,
    trace bytea,
    cancel_requested integer DEFAULT 0 NOT NULL,
    attempts text,
    epoch bigint DEFAULT 0 NOT NULL,
    costs bytea,
    events bytea
);


--
-- Name: work_units_seq_seq; Type: SEQUENCE; Schema: {{schema}}; Owner: -
--

CREATE SEQUENCE {{schema}}.work_units_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: work_units_seq_seq; Type: SEQUENCE OWNED BY; Schema: {{schema}}; Owner: -
--

ALTER SEQUENCE {{schema}}.work_units_seq_seq OWNED BY {{schema}}.work_units.seq;


--
-- Name: dependencies n; Type: DEFAULT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.dependencies ALTER COLUMN n SET DEFAULT nextval('{{schema}}.dependencies_n_seq'::regclass);


--
-- Name: event_ranges n; Type: DEFAULT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.event_ranges ALTER COLUMN n SET DEFAULT nextval('{{schema}}.event_ranges_n_seq'::regclass);


--
-- Name: service_log n; Type: DEFAULT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.service_log ALTER COLUMN n SET DEFAULT nextval('{{schema}}.service_log_n_seq'::regclass);


--
-- Name: work_units seq; Type: DEFAULT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.work_units ALTER COLUMN seq SET DEFAULT nextval('{{schema}}.work_units_seq_seq'::regclass);


--
-- Data for Name: activity; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--



--
-- Data for Name: assignments; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--



--
-- Data for Name: dependencies; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--



--
-- Data for Name: event_blocks; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.event_blocks VALUES (2, 1, 1795953600000000000, 1795953600000000000, '\x01008080ac919592c1ec31010b776f726b5f71756575656402067265706f72740306646f6e652d310000000100010204087175657565642d31000000');
INSERT INTO {{schema}}.event_blocks VALUES (3, 3, 1795953600000000000, 1795953600000000000, '\x01008080ac919592c1ec3101107363686564756c655f6368616e676564000000002c7b227363686564756c65223a22686f75726c79222c226368616e6765223a2272656769737465726564227d');


--
-- Data for Name: event_ranges; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.event_ranges VALUES (1, 'report', 'work_queued', 1, 2);
INSERT INTO {{schema}}.event_ranges VALUES (2, '', 'schedule_changed', 3, 3);


--
-- Data for Name: executors; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--



--
-- Data for Name: meta; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.meta VALUES ('events_last', 3);


--
-- Data for Name: meter_state; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--



--
-- Data for Name: owner_lease; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.owner_lease VALUES (1, 1649656, NULL, NULL);


--
-- Data for Name: questions; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.questions VALUES ('n1', '\x7b226e6f6e6365223a22222c226b696e64223a227365727669636573227d', 1795953600000000000, '\x5b5d');


--
-- Data for Name: queue_wait; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.queue_wait VALUES (29932560, 0, 1);


--
-- Data for Name: runcue_schema; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.runcue_schema VALUES (5);


--
-- Data for Name: schedules; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.schedules VALUES ('hourly', '\x7b227461736b223a227265706f7274227d', NULL, false, 1795953600000000000, 1795953600000000000, '', '');


--
-- Data for Name: service_log; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--



--
-- Data for Name: services; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--



--
-- Data for Name: subscriptions; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--



--
-- Data for Name: tasks; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.tasks VALUES ('report', '\x7b7d', false);


--
-- Data for Name: unit_counts; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.unit_counts VALUES ('report', 'queued', 1);
INSERT INTO {{schema}}.unit_counts VALUES ('report', 'running', 0);
INSERT INTO {{schema}}.unit_counts VALUES ('report', 'completed', 1);


--
-- Data for Name: work_units; Type: TABLE DATA; Schema: {{schema}}; Owner: -
--

INSERT INTO {{schema}}.work_units VALUES (2, 'queued-1', 'report', '', NULL, 'queued', 0, 0, 0, 1795953600000000000, 0, 0, 0, 0, NULL, 0, 0, NULL, NULL, NULL, 'k-queued', 0, NULL, NULL, 0, NULL, 0, NULL, '\x04');
INSERT INTO {{schema}}.work_units VALUES (1, 'done-1', 'report', '', NULL, 'completed', 1, 0, 0, 1795953600000000000, 0, 1795953600000000000, 1795953601000000000, 0, NULL, 0, 0, '\x226f6b22', NULL, NULL, 'k-done', 0, NULL, NULL, 0, '[{"run":1,"start":1795953600000000000,"end":1795953601000000000,"outcome":"completed"}]', 1649656, NULL, '\x02');


--
-- Name: dependencies_n_seq; Type: SEQUENCE SET; Schema: {{schema}}; Owner: -
--

SELECT pg_catalog.setval('{{schema}}.dependencies_n_seq', 1, false);


--
-- Name: event_ranges_n_seq; Type: SEQUENCE SET; Schema: {{schema}}; Owner: -
--

SELECT pg_catalog.setval('{{schema}}.event_ranges_n_seq', 2, true);


--
-- Name: service_log_n_seq; Type: SEQUENCE SET; Schema: {{schema}}; Owner: -
--

SELECT pg_catalog.setval('{{schema}}.service_log_n_seq', 1, false);


--
-- Name: work_units_seq_seq; Type: SEQUENCE SET; Schema: {{schema}}; Owner: -
--

SELECT pg_catalog.setval('{{schema}}.work_units_seq_seq', 2, true);


--
-- Name: activity activity_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.activity
    ADD CONSTRAINT activity_pkey PRIMARY KEY (minute, task, kind);


--
-- Name: assignments assignments_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.assignments
    ADD CONSTRAINT assignments_pkey PRIMARY KEY (work_id);


--
-- Name: dependencies dependencies_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.dependencies
    ADD CONSTRAINT dependencies_pkey PRIMARY KEY (unit_id, depends_on);


--
-- Name: event_blocks event_blocks_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.event_blocks
    ADD CONSTRAINT event_blocks_pkey PRIMARY KEY (last);


--
-- Name: event_ranges event_ranges_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.event_ranges
    ADD CONSTRAINT event_ranges_pkey PRIMARY KEY (n);


--
-- Name: executors executors_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.executors
    ADD CONSTRAINT executors_pkey PRIMARY KEY (id);


--
-- Name: meta meta_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.meta
    ADD CONSTRAINT meta_pkey PRIMARY KEY (key);


--
-- Name: meter_state meter_state_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.meter_state
    ADD CONSTRAINT meter_state_pkey PRIMARY KEY (service, meter);


--
-- Name: owner_lease owner_lease_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.owner_lease
    ADD CONSTRAINT owner_lease_pkey PRIMARY KEY (id);


--
-- Name: questions questions_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.questions
    ADD CONSTRAINT questions_pkey PRIMARY KEY (id);


--
-- Name: queue_wait queue_wait_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.queue_wait
    ADD CONSTRAINT queue_wait_pkey PRIMARY KEY (minute, bucket);


--
-- Name: schedules schedules_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);


--
-- Name: service_log service_log_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.service_log
    ADD CONSTRAINT service_log_pkey PRIMARY KEY (n);


--
-- Name: services services_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.services
    ADD CONSTRAINT services_pkey PRIMARY KEY (name);


--
-- Name: subscriptions subscriptions_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.subscriptions
    ADD CONSTRAINT subscriptions_pkey PRIMARY KEY (name);


--
-- Name: tasks tasks_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.tasks
    ADD CONSTRAINT tasks_pkey PRIMARY KEY (name);


--
-- Name: unit_counts unit_counts_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.unit_counts
    ADD CONSTRAINT unit_counts_pkey PRIMARY KEY (task, state);


--
-- Name: work_units work_units_id_key; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.work_units
    ADD CONSTRAINT work_units_id_key UNIQUE (id);


--
-- Name: work_units work_units_pkey; Type: CONSTRAINT; Schema: {{schema}}; Owner: -
--

ALTER TABLE ONLY {{schema}}.work_units
    ADD CONSTRAINT work_units_pkey PRIMARY KEY (seq);


--
-- Name: assignments_executor; Type: INDEX; Schema: {{schema}}; Owner: -
--

CREATE INDEX assignments_executor ON {{schema}}.assignments USING btree (executor);


--
-- Name: dependencies_reverse; Type: INDEX; Schema: {{schema}}; Owner: -
--

CREATE INDEX dependencies_reverse ON {{schema}}.dependencies USING btree (depends_on);


--
-- Name: event_ranges_last; Type: INDEX; Schema: {{schema}}; Owner: -
--

CREATE INDEX event_ranges_last ON {{schema}}.event_ranges USING btree (last);


--
-- Name: event_ranges_task; Type: INDEX; Schema: {{schema}}; Owner: -
--

CREATE INDEX event_ranges_task ON {{schema}}.event_ranges USING btree (task, last);


--
-- Name: event_ranges_type; Type: INDEX; Schema: {{schema}}; Owner: -
--

CREATE INDEX event_ranges_type ON {{schema}}.event_ranges USING btree (type, last);


--
-- Name: service_log_window; Type: INDEX; Schema: {{schema}}; Owner: -
--

CREATE INDEX service_log_window ON {{schema}}.service_log USING btree (service, started_at);


--
-- Name: work_units_finished; Type: INDEX; Schema: {{schema}}; Owner: -
--

CREATE INDEX work_units_finished ON {{schema}}.work_units USING btree (finished_at) WHERE (finished_at > 0);


--
-- Name: work_units_idempotency; Type: INDEX; Schema: {{schema}}; Owner: -
--

CREATE UNIQUE INDEX work_units_idempotency ON {{schema}}.work_units USING btree (idempotency_key) WHERE (idempotency_key IS NOT NULL);


--
-- Name: work_units_open; Type: INDEX; Schema: {{schema}}; Owner: -
--

CREATE INDEX work_units_open ON {{schema}}.work_units USING btree (state, seq) WHERE (state <> ALL (ARRAY['completed'::text, 'skipped'::text]));


--
-- PostgreSQL database dump complete
--


