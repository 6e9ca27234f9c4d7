-- runcue schema version 15: questions to the live owner, outside the event
-- log (owner_asked and owner_answered events before this).
--
-- question is the OwnerQuestion without its nonce (JSON); answer the
-- owner's answer (JSON; 'null' when it had none), NULL until given. The
-- asker deletes its row once it read the answer; the owner deletes rows a
-- minute old (their askers gave up).
CREATE TABLE questions (
    id       TEXT    PRIMARY KEY,
    question BLOB    NOT NULL,
    asked_at INTEGER NOT NULL,
    answer   BLOB
);
