package runcuecli

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// dbKind is what --db names: a SQLite file or a PostgreSQL database.
type dbKind int

const (
	sqliteFile dbKind = iota
	postgresDB
)

// keywordDSN matches a PostgreSQL keyword/value connection string
// ("host=db user=app password=..."): its first word is a known keyword.
var keywordDSN = regexp.MustCompile(`^\s*(host|hostaddr|port|dbname|user|password|sslmode|service|connect_timeout|application_name|target_session_attrs)\s*=`)

// schemeOf matches a URL's scheme ("postgres://", "POSTGRES://",
// "postgress://").
var schemeOf = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*)://`)

// classifyDB says what db names, and returns it as pgx and SQLite take
// it: a PostgreSQL URL whose scheme is written in any case (postgres://,
// postgresql://), or a keyword/value connection string, names a
// PostgreSQL database; another scheme is refused (a mistyped one would
// otherwise be taken for a file's path); anything else is a SQLite file's
// path (file: URLs included).
func classifyDB(db string) (dbKind, string, error) {
	if keywordDSN.MatchString(db) {
		return postgresDB, db, nil
	}
	if m := schemeOf.FindStringSubmatch(db); m != nil {
		switch strings.ToLower(m[1]) {
		case "postgres", "postgresql":
			return postgresDB, strings.ToLower(m[1]) + db[len(m[1]):], nil
		case "file":
			return sqliteFile, db, nil
		}
		return 0, "", usageError{fmt.Errorf("--db %s: unknown scheme %q: a PostgreSQL database is postgres://... (or host=... keywords), a SQLite database a file's path", redactDSN(db), m[1])}
	}
	return sqliteFile, db, nil
}

// isPostgresURL reports whether db names a PostgreSQL database.
func isPostgresURL(db string) bool {
	k, _, err := classifyDB(db)
	return err == nil && k == postgresDB
}

// keywordPassword matches a keyword connection string's password.
var keywordPassword = regexp.MustCompile(`(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// passwordOf returns the password a connection string holds ("" if none).
func passwordOf(db string) string {
	if m := keywordPassword.FindStringSubmatch(db); m != nil {
		return strings.Trim(m[1], "'")
	}
	if m := schemeOf.FindStringSubmatch(db); m != nil {
		if u, err := url.Parse(db); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok {
				return p
			}
		}
		// A URL that does not parse: what stands between "user:" and "@".
		rest := db[len(m[0]):]
		if at := strings.LastIndexByte(rest, '@'); at > 0 {
			if colon := strings.IndexByte(rest[:at], ':'); colon >= 0 {
				return rest[colon+1 : at]
			}
		}
	}
	if q := strings.IndexByte(db, '?'); q >= 0 {
		if v, err := url.ParseQuery(db[q+1:]); err == nil {
			return v.Get("password")
		}
	}
	return ""
}

// redactDSN is db with its password replaced.
func redactDSN(db string) string { return redactIn(db, db) }

// redactIn is s with the password that db holds replaced, wherever it
// appears (an error may quote the connection string, or a path made of
// it).
func redactIn(s, db string) string {
	p := passwordOf(db)
	if p == "" {
		return s
	}
	s = strings.ReplaceAll(s, p, "xxxxx")
	if esc := url.QueryEscape(p); esc != p {
		s = strings.ReplaceAll(s, esc, "xxxxx")
	}
	if esc := url.PathEscape(p); esc != p {
		s = strings.ReplaceAll(s, esc, "xxxxx")
	}
	return s
}
