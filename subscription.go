package runcue

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/runcue/runcue/store"
)

// Durable subscriptions: a named subscription's position is stored, so a
// consumer that submits follow-up work from events resumes after a crash
// where it left off, and Drain can wait for it (Config.DrainSubscriptions).
//
// The exactly-once recipe: for each event, submit the follow-ups with
// idempotency keys derived from the event (its unit's ID and the
// follow-up's place), then Ack the event's Seq. A crash before the Ack
// redelivers the event; the resubmission stores nothing new.

// broadcast wakes every goroutine waiting for something to happen. Safe
// for concurrent use.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next notify.
func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// SubscriptionStatus reports a durable subscription.
type SubscriptionStatus struct {
	Name string `json:"name"`
	// Acked is the last sequence number acknowledged. Position is where
	// the subscription stands: Acked, or past it the events its filter
	// skips up to the next one it matches (see SubscribeOptions.Name).
	// Lag is how many sequence numbers have been committed since Position.
	Acked    int64 `json:"acked"`
	Position int64 `json:"position"`
	Lag      int64 `json:"lag"`
	// Types and Tasks are its filter, as its latest Subscribe gave it.
	Types []EventType `json:"types,omitempty"`
	Tasks []string    `json:"tasks,omitempty"`
	// CreatedAt and AckedAt are when it was created and last acknowledged.
	CreatedAt time.Time `json:"created_at"`
	AckedAt   time.Time `json:"acked_at,omitzero"`
}

// subscriptionStart returns the position a subscription named name
// resumes after, creating it at after (SeqNow: the last event committed)
// if it is new, with its filter (types, tasks); a known subscription
// whose stored filter differs takes this one.
func (c *Cue) subscriptionStart(ctx context.Context, name string, after int64, types []EventType, tasks []string) (int64, error) {
	if err := validName("subscription", name); err != nil {
		return 0, err
	}
	typeNames := make([]string, len(types))
	for i, t := range types {
		typeNames[i] = string(t)
	}
	for range 2 {
		subs, err := c.st.Subscriptions(ctx)
		if err != nil {
			return 0, c.readErr(err)
		}
		if i := slices.IndexFunc(subs, func(s store.Subscription) bool { return s.Name == name }); i >= 0 {
			if !slices.Equal(subs[i].Types, typeNames) || !slices.Equal(subs[i].Tasks, tasks) {
				if _, err := c.w.Do(ctx, &store.Ack{Name: name, SetFilter: true, Types: typeNames, Tasks: tasks}); err != nil {
					return 0, wrapStoreErr(err)
				}
			}
			return subs[i].Acked, nil
		}
		start := after
		if start == SeqNow {
			if err := c.w.Sync(ctx); err != nil {
				return 0, wrapStoreErr(err)
			}
			if start, err = c.st.LastSeq(ctx); err != nil {
				return 0, c.readErr(err)
			}
		}
		res, err := c.w.Do(ctx, &store.Ack{Name: name, Seq: start, At: c.clock.Now(), Create: true, Types: typeNames, Tasks: tasks})
		if err != nil {
			return 0, wrapStoreErr(err)
		}
		if res[0].Applied {
			return start, nil
		}
		// Created meanwhile by another subscriber: read its position.
	}
	return 0, fmt.Errorf("runcue: subscription %q: created and deleted concurrently", name)
}

// Ack records that the durable subscription name has handled every event
// up to seq: after a restart it resumes after seq. A position never moves
// back: an older seq is ignored. The acknowledgement is stored before Ack
// returns (acknowledgements of many goroutines share a commit).
func (c *Cue) Ack(ctx context.Context, name string, seq int64) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	res, err := c.w.Do(ctx, &store.Ack{Name: name, Seq: seq, At: c.clock.Now()})
	if err != nil {
		return wrapStoreErr(err)
	}
	if !res[0].Applied {
		return fmt.Errorf("%w: %q", ErrUnknownSubscription, name)
	}
	c.acked.notify()
	return nil
}

// DeleteSubscription forgets a durable subscription: its position goes,
// and retention no longer keeps events for it.
func (c *Cue) DeleteSubscription(ctx context.Context, name string) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	res, err := c.w.Do(ctx, &store.Ack{Name: name, Remove: true})
	if err != nil {
		return wrapStoreErr(err)
	}
	if !res[0].Applied {
		return fmt.Errorf("%w: %q", ErrUnknownSubscription, name)
	}
	return nil
}

// Subscriptions reports the durable subscriptions, by name.
func (c *Cue) Subscriptions(ctx context.Context) ([]SubscriptionStatus, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	subs, err := c.st.Subscriptions(ctx)
	if err != nil {
		return nil, c.readErr(err)
	}
	last, err := c.st.LastSeq(ctx)
	if err != nil {
		return nil, c.readErr(err)
	}
	out := make([]SubscriptionStatus, len(subs))
	for i, s := range subs {
		pos, err := store.Position(ctx, c.st, s, last)
		if err != nil {
			return nil, c.readErr(err)
		}
		out[i] = SubscriptionStatus{Name: s.Name, Acked: s.Acked, Position: pos, Lag: max(last-pos, 0), Tasks: s.Tasks,
			CreatedAt: s.CreatedAt, AckedAt: s.AckedAt}
		for _, t := range s.Types {
			out[i].Types = append(out[i].Types, EventType(t))
		}
	}
	return out, nil
}

// knownDrainSubscriptions refuses, at the start of Drain, a name of
// Config.DrainSubscriptions that is not a durable subscription: Drain
// would otherwise find out only once the work is done.
func (c *Cue) knownDrainSubscriptions(ctx context.Context) error {
	if len(c.cfg.DrainSubscriptions) == 0 {
		return nil
	}
	subs, err := c.st.Subscriptions(ctx)
	if err != nil {
		return c.readErr(err)
	}
	for _, name := range c.cfg.DrainSubscriptions {
		if !slices.ContainsFunc(subs, func(s store.Subscription) bool { return s.Name == name }) {
			return fmt.Errorf("%w: %q (Config.DrainSubscriptions; subscribe with SubscribeOptions.Name before Drain)",
				ErrUnknownSubscription, name)
		}
	}
	return nil
}

// waitAcked waits until every subscription of Config.DrainSubscriptions
// has acknowledged the events committed, and reports whether events were
// committed after since, the log's end the caller read before it found
// the work done: follow-ups a consumer submitted, before or while this
// waits, which Drain must look at again.
func (c *Cue) waitAcked(ctx context.Context, since int64) (moved bool, err error) {
	names := c.cfg.DrainSubscriptions
	if len(names) == 0 {
		return false, nil
	}
	if err := c.w.Sync(ctx); err != nil {
		return false, wrapStoreErr(err)
	}
	last, err := c.st.LastSeq(ctx)
	if err != nil {
		return false, c.readErr(err)
	}
	for {
		wake := c.acked.wait()
		subs, err := c.st.Subscriptions(ctx)
		if err != nil {
			return false, c.readErr(err)
		}
		done := true
		for _, name := range names {
			i := slices.IndexFunc(subs, func(s store.Subscription) bool { return s.Name == name })
			if i < 0 {
				return false, fmt.Errorf("%w: %q (Config.DrainSubscriptions)", ErrUnknownSubscription, name)
			}
			pos, err := store.Position(ctx, c.st, subs[i], last)
			if err != nil {
				return false, c.readErr(err)
			}
			if pos < last {
				done = false
			}
		}
		if done {
			now, err := c.st.LastSeq(ctx)
			if err != nil {
				return false, c.readErr(err)
			}
			return now != since, nil
		}
		// Acknowledged here (wake) or, from another process, seen at the
		// next poll.
		t := c.clock.NewTimer(c.cfg.PollInterval)
		select {
		case <-wake:
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		}
		t.Stop()
	}
}
