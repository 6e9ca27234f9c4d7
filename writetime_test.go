package runcue_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/runcue/runcue"
	"github.com/runcue/runcue/clock"
	"github.com/runcue/runcue/store"
	"github.com/runcue/runcue/store/sqlite"
)

// advancingStore's every Apply takes took by the fake clock.
type advancingStore struct {
	store.Store
	clk     *clock.Fake
	took    time.Duration
	applies atomic.Int64
}

func (s *advancingStore) Apply(ctx context.Context, ops []store.Op) (store.Batch, error) {
	s.applies.Add(1)
	s.clk.Advance(s.took)
	return s.Store.Apply(ctx, ops)
}

// TestWriteTimeMetrics: runcue.store.transactions counts the writer's
// transactions, and runcue.store.write_time the time they took by the
// Cue's clock: here every Apply takes 5 ms of the fake clock, which also
// moves by a second between them (idle time, not counted).
func TestWriteTimeMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	sq, err := sqlite.Open(filepath.Join(t.TempDir(), "runcue.db"), sqlite.Options{})
	require.NoError(t, err)
	defer sq.Close()
	clk := clock.NewFake(epoch)
	st := &advancingStore{Store: sq, clk: clk, took: 5 * time.Millisecond}
	c, err := runcue.New(st, runcue.Config{Clock: clk, Logger: quietLogger, MeterProvider: mp})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Task("t", runcue.Task{Handler: func(context.Context, *runcue.Work) (any, error) { return nil, nil }}))
	require.NoError(t, c.Start(ctx))
	for range 3 {
		_, err := c.SubmitBatch(ctx, []runcue.Submission{{Task: "t"}, {Task: "t"}})
		require.NoError(t, err)
		require.NoError(t, runcue.Settle(ctx, c))
		clk.Advance(time.Second)
	}
	require.NoError(t, c.Stop(ctx))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	var txs int64
	var busy float64
	found := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case "runcue.store.transactions":
				found++
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					txs += dp.Value
				}
			case "runcue.store.write_time":
				found++
				data := m.Data.(metricdata.Sum[float64])
				require.True(t, data.IsMonotonic, "a counter")
				for _, dp := range data.DataPoints {
					busy += dp.Value
				}
			}
		}
	}
	require.Equal(t, 2, found, "both metrics reported")
	batches, _ := runcue.WriterStats(c)
	require.Equal(t, batches, txs)
	applies := st.applies.Load()
	require.Positive(t, applies)
	require.Equal(t, batches, applies, "no transaction failed")
	require.InDelta(t, float64(applies)*0.005, busy, 1e-9, "5 ms a transaction, the idle seconds left out")
}
