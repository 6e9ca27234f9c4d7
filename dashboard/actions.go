package dashboard

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/runcue/runcue"
)

// flashCookie carries the message of an action to the page it redirects
// to. A cookie, not the URL: a link cannot set it, so no other site can
// make the dashboard show words of its choosing.
const flashCookie = "runcue_flash"

// back redirects to the page the action came from (a path under the
// dashboard), with a message for that page alone.
func back(w http.ResponseWriter, r *http.Request, to, flash string) {
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: url.QueryEscape(flash), Path: base(r), MaxAge: 60,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, base(r)+to, http.StatusSeeOther)
}

// takeFlash returns the message an action left for this page, and clears
// it.
func takeFlash(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: base(r), MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	msg, err := url.QueryUnescape(c.Value)
	if err != nil {
		return ""
	}
	return msg
}

// serviceAction pauses, resumes, sets the limits of or resets a service.
func (d *dash) serviceAction(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	name := r.FormValue("service")
	var err error
	var done string
	switch r.FormValue("op") {
	case "pause":
		err, done = d.c.PauseService(ctx, name), "paused "+name
	case "resume":
		err, done = d.c.ResumeService(ctx, name), "resumed "+name
	case "reset":
		err, done = d.c.ResetService(ctx, name), "reset the limits of "+name
	case "set":
		var s runcue.Service
		s, err = d.limits(r, name)
		if err == nil {
			err, done = d.c.SetService(ctx, name, s), "set the limits of "+name
		}
	default:
		err = fmt.Errorf("%w: unknown operation %q", runcue.ErrInvalid, r.FormValue("op"))
	}
	if err != nil {
		d.fail(w, err)
		return
	}
	back(w, r, "services", done)
}

// limits reads the limits form: the service's limits in force, changed
// where a field is given.
func (d *dash) limits(r *http.Request, name string) (runcue.Service, error) {
	st, err := d.c.ServiceStatus(r.Context(), name)
	if err != nil {
		return runcue.Service{}, err
	}
	s := st.Limits
	num := func(field string, into *int) error {
		v := r.FormValue(field)
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("%w: %s %q", runcue.ErrInvalid, field, v)
		}
		*into = n
		return nil
	}
	var windowMS int
	if err := errors.Join(num("max_concurrent", &s.MaxConcurrent), num("rate_limit", &s.RateLimit), num("rate_window_ms", &windowMS)); err != nil {
		return s, err
	}
	if windowMS > 0 {
		s.RateWindow = time.Duration(windowMS) * time.Millisecond
	}
	if s.RateLimit == 0 {
		s.RateWindow = 0
	}
	return s, nil
}

// unitAction retries or cancels one unit.
func (d *dash) unitAction(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.FormValue("id")
	var err error
	var done string
	switch r.FormValue("op") {
	case "retry":
		err, done = d.c.Retry(ctx, id), "requeued "+id
	case "cancel":
		err, done = d.c.Cancel(ctx, id, runcue.CancelOptions{}), "cancelled "+id
	case "cancel_cascade":
		err, done = d.c.Cancel(ctx, id, runcue.CancelOptions{Cascade: true}), "cancelled "+id+" and its dependents"
	default:
		err = fmt.Errorf("%w: unknown operation %q", runcue.ErrInvalid, r.FormValue("op"))
	}
	if err != nil {
		d.fail(w, err)
		return
	}
	back(w, r, "work/"+url.PathEscape(id), done)
}

// confirmData is the bulk confirmation page.
type confirmData struct {
	Op     string
	Filter workFilter
	Count  int
}

// bulkAction retries or cancels every unit the work list's filter
// selects. Without confirm=1 it counts them (a dry run) and asks.
func (d *dash) bulkAction(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	f := filterOf(r)
	f.Cursor = "" // a bulk action takes the whole filter, not a page
	o, err := f.options(time.Now(), 0)
	if err != nil {
		d.fail(w, err)
		return
	}
	o.Cursor, o.Limit, o.Newest = "", 0, false
	op := r.FormValue("op")
	dry := r.FormValue("confirm") != "1"
	var n int
	switch op {
	case "retry":
		n, err = d.c.RetryWhere(ctx, o, dry)
	case "cancel":
		n, err = d.c.CancelWhere(ctx, o, runcue.CancelOptions{}, dry)
	default:
		err = fmt.Errorf("%w: unknown operation %q", runcue.ErrInvalid, op)
	}
	if err != nil {
		d.fail(w, err)
		return
	}
	if dry {
		d.render(w, r, "confirm", "", confirmData{Op: op, Filter: f, Count: n})
		return
	}
	q := f.values()
	verb := map[string]string{"retry": "requeued", "cancel": "cancelled"}[op]
	back(w, r, "work?"+q.Encode(), fmt.Sprintf("%s %d units", verb, n))
}
