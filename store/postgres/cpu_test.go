package postgres_test

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// A benchmark run's rate and the machine's CPU it took.
type runStats struct {
	rate float64 // units per second
	// cpu is the machine's busy CPU time a unit (microseconds), every
	// process counted (PostgreSQL's, the scheduler's, the executors'),
	// and busy the share of the machine's CPU time that was busy; both 0
	// where /proc/stat cannot be read (not Linux).
	cpu, busy float64
	// writer is the share of the run the scheduler's writer was busy
	// (runcue.store.write_time), where measured.
	writer float64
	wall   time.Duration
}

// cpuSpan measures a run: the wall time and the machine's CPU time from
// its start.
type cpuSpan struct {
	start         time.Time
	busy0, total0 int64
	ok            bool
}

func startSpan() cpuSpan {
	busy, total, ok := machineCPU()
	return cpuSpan{start: time.Now(), busy0: busy, total0: total, ok: ok}
}

// end returns the stats of n units run since the span started.
func (s cpuSpan) end(n int) runStats {
	wall := time.Since(s.start)
	st := runStats{rate: float64(n) / wall.Seconds(), wall: wall}
	busy, total, ok := machineCPU()
	if s.ok && ok && total > s.total0 {
		st.cpu = float64(busy-s.busy0) / float64(hz) * 1e6 / float64(n)
		st.busy = float64(busy-s.busy0) / float64(total-s.total0)
	}
	return st
}

// hz is /proc/stat's clock ticks a second (USER_HZ, 100 on every Linux
// architecture Go builds for).
const hz = 100

// machineCPU reads the ticks all CPUs spent busy (user, nice, system,
// irq, softirq) and in all (those, idle and iowait; time stolen by a
// hypervisor is in neither) from /proc/stat.
func machineCPU() (busy, total int64, ok bool) {
	if runtime.GOOS != "linux" {
		return 0, 0, false
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0, false
	}
	var v [7]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return 0, 0, false
		}
	}
	busy = v[0] + v[1] + v[2] + v[5] + v[6]
	return busy, busy + v[3] + v[4], true
}
