package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runcue/runcue/store"
)

// Ownership on PostgreSQL is a lease row (owner_lease) carrying the owner
// epoch: no session state, so it works behind any connection pooler. The
// holder renews it every LeaseTTL/4 on the database's clock; a holder
// that dies is replaced once its lease expires. Every owner write checks
// the epoch in its own transaction (txn.fenced), so a deposed owner's
// late writes fail with store.ErrNotOwner.

// Acquire takes ownership for h if the lease is free (released, or
// expired by the database's clock), moving the owner epoch on. A live
// lease gives a *store.LockedError naming its holder.
func (s *Store) Acquire(ctx context.Context, h store.Holder) (store.Ownership, error) {
	return s.take(ctx, h, false)
}

// TakeOver takes ownership whether or not the lease is live: the epoch
// moves on, so every later write of the previous owner fails with
// store.ErrNotOwner, and that owner's runs are recovered only once their
// own leases expire. It is for an operator who knows the holder is stuck,
// and for tests of fencing.
func (s *Store) TakeOver(ctx context.Context, h store.Holder) (store.Ownership, error) {
	return s.take(ctx, h, true)
}

func (s *Store) take(ctx context.Context, h store.Holder, force bool) (store.Ownership, error) {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	if s.own != nil && !force {
		return nil, &store.LockedError{Holder: s.own.holder}
	}
	holder, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("runcue: take ownership: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var current []byte
	var live bool
	if err := tx.QueryRow(ctx, `SELECT holder, coalesce(expires_at > clock_timestamp(), false) FROM owner_lease WHERE id = 1 FOR UPDATE`).
		Scan(&current, &live); err != nil {
		return nil, fmt.Errorf("runcue: take ownership: %w", err)
	}
	if current != nil && live && !force {
		var prev store.Holder
		_ = json.Unmarshal(current, &prev)
		return nil, &store.LockedError{Holder: prev}
	}
	var epoch int64
	sent := time.Now() // the lease runs from after this, by the database's clock
	// The epoch's high bits count the takes; its low epochSalt bits are
	// drawn at random, so that a take on a database that lost commits (a
	// lagging asynchronous replica promoted, a restore) hands out a new
	// epoch, not one a deposed owner of the lost history still holds: the
	// counter alone would go back and count the same number again.
	salt := 1 + rand.Int64N(1<<epochSalt-1)
	if err := tx.QueryRow(ctx, `UPDATE owner_lease SET epoch = (((epoch >> $3) + 1) << $3) | $4, holder = $1,
		expires_at = clock_timestamp() + $2 * interval '1 microsecond'
		WHERE id = 1 RETURNING epoch`, string(holder), s.opts.LeaseTTL.Microseconds(), epochSalt, salt).Scan(&epoch); err != nil {
		return nil, fmt.Errorf("runcue: take ownership: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("runcue: take ownership: %w", err)
	}
	o := &ownership{s: s, holder: h, epoch: epoch,
		stop: make(chan struct{}), done: make(chan struct{}), lost: make(chan struct{})}
	o.renewed = sent
	go o.renew(sent)
	s.own = o
	return o, nil
}

// Owner reports the live lease's holder, if any.
func (s *Store) Owner(ctx context.Context) (store.Holder, bool, error) {
	var current []byte
	var live bool
	err := s.pool.QueryRow(ctx, `SELECT holder, coalesce(expires_at > clock_timestamp(), false) FROM owner_lease WHERE id = 1`).Scan(&current, &live)
	if err != nil || current == nil || !live {
		return store.Holder{}, false, err
	}
	var h store.Holder
	if err := json.Unmarshal(current, &h); err != nil {
		return store.Holder{}, false, err
	}
	return h, true, nil
}

// epochSalt is how many low bits of an epoch are random (see take).
const epochSalt = 20

type ownership struct {
	s      *Store
	holder store.Holder
	epoch  int64

	stop, done chan struct{}
	once       sync.Once
	// lost is closed when the holder stops trusting its lease (Lost).
	lost chan struct{}
	// mu guards renewed, when the last renewal that succeeded was sent
	// (this process's monotonic clock), and deposed: the epoch moved on.
	mu      sync.Mutex
	renewed time.Time
	deposed bool
}

// Trusted implements store.Leased: the last renewal that succeeded was
// sent less than LeaseTTL/2 ago, by this process's monotonic clock (which
// runs on while the process is frozen), and no other holder took over.
func (o *ownership) Trusted() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.deposed && time.Since(o.renewed) < o.s.opts.LeaseTTL/2
}

// Lost implements store.Leased: it is closed once the lease has gone
// unrenewed for LeaseTTL/2, counted by this process's clock from the
// sending of the last renewal that succeeded (the database extended the
// lease from a later instant), or once another holder has taken over.
// The other half of the TTL is the margin for a renewal in flight, a
// clock that runs slow, and the engine's stop: a standby takes over only
// once the lease has expired by the database's clock.
func (o *ownership) Lost() <-chan struct{} { return o.lost }

func (o *ownership) Epoch() int64 { return o.epoch }

// PreviousDead is false: a lease proves no earlier holder's process dead
// (a clean release proves only that the last holder stopped, not that a
// holder deposed before it did), so the runs they left wait for their
// leases to expire.
func (o *ownership) PreviousDead() bool { return false }

// renew extends the lease every LeaseTTL/4 until Release, or until the
// holder stops trusting it (Lost). It runs on a goroutine of its own,
// which Release stops and waits for. A renewal in flight does not delay
// the loss of trust: the trust timer is watched while it runs (a
// blackholed connection's renewal hangs until its deadline).
func (o *ownership) renew(renewed time.Time) {
	defer close(o.done)
	ttl := o.s.opts.LeaseTTL
	tick := time.NewTicker(ttl / 4)
	defer tick.Stop()
	trust := time.NewTimer(time.Until(renewed.Add(ttl / 2)))
	defer trust.Stop()
	type answer struct {
		sent     time.Time
		affected int64
		err      error
	}
	answers := make(chan answer, 1)
	inFlight := false
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		if inFlight {
			<-answers
		}
	}()
	for {
		select {
		case <-o.stop:
			return
		case <-trust.C:
			close(o.lost)
			return
		case a := <-answers:
			inFlight = false
			switch {
			case a.err != nil:
				// Not renewed: the trust timer runs on, unless a later
				// renewal works.
			case a.affected == 0:
				o.mu.Lock()
				o.deposed = true
				o.mu.Unlock()
				close(o.lost) // another holder took over
				return
			default:
				o.mu.Lock()
				o.renewed = a.sent
				o.mu.Unlock()
				trust.Reset(time.Until(a.sent.Add(ttl / 2)))
			}
		case <-tick.C:
			if inFlight {
				continue // the last renewal still runs (until its deadline)
			}
			inFlight = true
			go func() {
				sent := time.Now()
				ctx, cancel := context.WithTimeout(ctx, ttl/4)
				defer cancel()
				tag, err := o.s.pool.Exec(ctx, `UPDATE owner_lease SET expires_at = clock_timestamp() + $1 * interval '1 microsecond' WHERE id = 1 AND epoch = $2`,
					ttl.Microseconds(), o.epoch)
				answers <- answer{sent, tag.RowsAffected(), err}
			}()
		}
	}
}

// Release gives the lease up (if this holder still has it). It is safe to
// call more than once.
func (o *ownership) Release() error {
	var err error
	o.once.Do(func() {
		close(o.stop)
		<-o.done
		o.s.ownMu.Lock()
		if o.s.own == o {
			o.s.own = nil
		}
		o.s.ownMu.Unlock()
		// A holder that lost its lease may be cut off from the database:
		// it tries for LeaseTTL/2 (the lease ends by itself meanwhile).
		wait := 10 * time.Second
		select {
		case <-o.lost:
			wait = min(wait, o.s.opts.LeaseTTL/2)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_, err = o.s.pool.Exec(ctx, `UPDATE owner_lease SET holder = NULL, expires_at = NULL WHERE id = 1 AND epoch = $1`, o.epoch)
	})
	return err
}

// Watch implements store.Watcher: a connection of its own LISTENs on the
// schema's channel (each commit that appends events notifies it once), and
// the returned channel receives, coalesced, until ctx ends. A lost
// connection is opened again after a pause; meanwhile the Cue's polling
// still finds the commits.
func (s *Store) Watch(ctx context.Context) (<-chan struct{}, error) {
	return s.watch(ctx, s.channel, "")
}

// watch listens on channel, on a connection of its own, for notifications
// whose payload is payload; the returned channel receives, coalesced,
// until ctx ends. A lost connection is opened again after a pause (the
// channel then receives: notifications may have come meanwhile).
func (s *Store) watch(ctx context.Context, channel, payload string) (<-chan struct{}, error) {
	if s.opts.PollOnly {
		return nil, errPollOnly
	}
	conn, err := s.listen(ctx, channel)
	if err != nil {
		return nil, err
	}
	ch := make(chan struct{}, 1)
	go func() {
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		for ctx.Err() == nil {
			if conn == nil {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				if conn, err = s.listen(ctx, channel); err != nil {
					conn = nil
					continue
				}
				// Commits may have come while not listening.
				select {
				case ch <- struct{}{}:
				default:
				}
			}
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				conn.Close(context.Background())
				conn = nil
				continue
			}
			if n.Payload != payload {
				continue
			}
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	return ch, nil
}

// errPollOnly is Watch's answer with Options.PollOnly: the Cue polls.
var errPollOnly = errors.New("runcue: postgres: PollOnly: no change notifications")

// listen opens a connection (with the pool's settings) listening on
// channel.
func (s *Store) listen(ctx context.Context, channel string) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{channel}.Sanitize()); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

var (
	_ store.Watcher     = (*Store)(nil)
	_ store.OwnerProber = (*Store)(nil)
	_ store.Leased      = (*ownership)(nil)
)
