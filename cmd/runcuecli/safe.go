package runcuecli

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// What a table prints comes from units, services and handlers: a target,
// an error, a name may hold control characters. Printed raw, an escape
// sequence in a target ("\x1b]0;PWNED\a\x1b[2J") retitles and clears the
// operator's terminal. Tables are written through a terminalSafe writer,
// and their cells through cell.

// terminalSafe writes to w with every control character but tab and
// newline (the table's own) escaped: the C0 and C1 controls and DEL as
// \xNN or \u00NN, the Unicode controls that reorder text (bidi overrides
// and isolates) as \u{NNNN}, and bytes that are not UTF-8 as \xNN.
type terminalSafe struct{ w io.Writer }

func (t terminalSafe) Write(p []byte) (int, error) {
	if clean(p) {
		return t.w.Write(p)
	}
	var b strings.Builder
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, p[i])
		case r == '\t' || r == '\n':
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x80 && r < 0xa0:
			fmt.Fprintf(&b, `\u%04x`, r)
		case reorders(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.Write(p[i : i+n])
		}
		i += n
	}
	if _, err := io.WriteString(t.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// clean reports whether p needs no escaping (the common case: printable
// ASCII, tabs and newlines).
func clean(p []byte) bool {
	for _, c := range p {
		if c >= 0x7f || (c < 0x20 && c != '\t' && c != '\n') {
			return false
		}
	}
	return true
}

// reorders reports a Unicode control that changes the order text is shown
// in (bidirectional embeddings, overrides and isolates).
func reorders(r rune) bool {
	return (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f || r == 0x061c
}

// cellEscapes escapes the characters that would break a table's layout.
var cellEscapes = strings.NewReplacer("\t", `\t`, "\n", `\n`, "\r", `\r`)

// cell is a table cell of data: "-" when empty, its tabs and newlines
// escaped (the writer escapes the other control characters).
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return cellEscapes.Replace(s)
}
