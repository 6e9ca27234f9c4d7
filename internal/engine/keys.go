package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Keyed services: a task's ServiceKeys callback, called off the loop with
// a timeout, names the keyed instances each unit needs.

// deriveKeys computes u's keyed services with its task's ServiceKeys. A
// failure (a panic, a malformed key, an unknown class) is kept: the unit
// then fails permanently when it runs, without its handler.
func (x *unitIndex) deriveKeys(u *unit, rt *taskRT) {
	if rt.spec.Keys == nil {
		return
	}
	if !u.hasParams {
		su, err := x.st.GetUnit(context.Background(), u.id)
		if err != nil {
			u.ext().keyErr = fmt.Errorf("runcue: load unit to derive its service keys: %w", err)
			return
		}
		u.params, u.hasParams = su.Params, true
	}
	keys, err := x.keys.call(rt.spec.Keys, UnitView{ID: u.id, Task: u.task, Target: u.target, Params: u.params, Attempt: int(u.runs) + 1},
		x.cfg.CallbackTimeout)
	if err == nil {
		err = x.checkKeys(keys)
	}
	if err != nil {
		u.ext().keyErr = fmt.Errorf("runcue: service keys of %s: %w", u.id, err)
		switch {
		case errors.Is(err, errCallbackPanic):
			x.cbErrs.report("service_keys", "panic", err.Error(), "work_id", u.id, "task_type", u.task)
		case errors.Is(err, errCallbackTimeout):
			x.cbErrs.report("service_keys", "timeout", err.Error(), "work_id", u.id, "task_type", u.task)
		default:
			x.log.Warn("runcue: deriving service keys failed; the unit will fail", "work_id", u.id, "task_type", u.task, "error", err)
		}
		return
	}
	if len(keys) == 0 && u.more == nil {
		return
	}
	slices.Sort(keys)
	u.ext().keys = slices.Compact(keys)
}

// keysCaller calls ServiceKeys callbacks off the dispatcher goroutine, on
// a worker goroutine of its own, and waits at most CallbackTimeout for
// each: a callback that hangs costs its unit (which fails), not the loop.
// A worker stuck in a callback is abandoned (it exits once the callback
// returns) and the next call starts a new one. Only the dispatcher
// goroutine uses it.
type keysCaller struct {
	ch    chan keysCall // to the current worker; nil: none yet
	timer *time.Timer
}

type keysCall struct {
	f   func(UnitView) ([]string, error)
	w   UnitView
	out chan keysResult
}

type keysResult struct {
	keys []string
	err  error
}

// errCallbackTimeout marks a callback that did not answer in time.
var errCallbackTimeout = errors.New("timeout")

func (kc *keysCaller) call(f func(UnitView) ([]string, error), w UnitView, timeout time.Duration) ([]string, error) {
	if kc.ch == nil {
		kc.ch = make(chan keysCall, 1)
		go func(ch chan keysCall) {
			for c := range ch {
				keys, err := CallKeys(c.f, c.w)
				c.out <- keysResult{keys, err}
			}
		}(kc.ch)
	}
	out := make(chan keysResult, 1)
	kc.ch <- keysCall{f, w, out}
	if kc.timer == nil {
		kc.timer = time.NewTimer(timeout)
	} else {
		kc.timer.Reset(timeout)
	}
	select {
	case r := <-out:
		kc.timer.Stop()
		return r.keys, r.err
	case <-kc.timer.C:
		close(kc.ch) // the stuck worker exits once the callback returns
		kc.ch = nil
		return nil, fmt.Errorf("%w: ServiceKeys did not return within %v", errCallbackTimeout, timeout)
	}
}

// stop ends the worker (once its current callback, if any, returns).
func (kc *keysCaller) stop() {
	if kc.ch != nil {
		close(kc.ch)
		kc.ch = nil
	}
	if kc.timer != nil {
		kc.timer.Stop()
	}
}

func CallKeys(f func(UnitView) ([]string, error), w UnitView) (keys []string, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %v", errCallbackPanic, v)
		}
	}()
	return f(w)
}

func (t *resourceTable) checkKeys(keys []string) error {
	for _, k := range keys {
		i := strings.IndexByte(k, ':')
		if i <= 0 || i == len(k)-1 {
			return fmt.Errorf("key %q is not of the form class:key", k)
		}
		if _, ok := t.services[k[:i]]; !ok {
			return fmt.Errorf("key %q: %w %q", k, ErrUnknownService, k[:i])
		}
	}
	return nil
}
