package main

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/runcue/runcue"
)

// unitSpec is one unit the simulator submits.
type unitSpec struct {
	id       string
	task     string
	target   string // "": its ID
	priority int
	deps     []string
}

// group is one submission: a pattern's units, in the order submitted.
type group struct {
	at      time.Duration // since the run's start
	pattern string
	order   string
	units   []unitSpec
}

// generator draws the workload: groups of units arriving as a Poisson
// process at the configured rate (times the burst factor during a
// burst), and a separate stream of high-priority units when HighRate is
// set. It is deterministic for a seed.
type generator struct {
	w        Workload
	rng      *rand.Rand
	next     time.Duration // the next group's arrival
	nextHigh time.Duration // the next high-priority unit's arrival
	groups   int
	units    int
	meanSize float64
	weights  []string // patterns of PatternWeights, sorted
	// rateScale multiplies the rate (the TUI's R key); 1 in headless runs.
	rateScale func() float64
}

func newGenerator(w Workload, seed uint64) *generator {
	g := &generator{w: w, rng: rand.New(rand.NewPCG(seed, 0x5eed)), rateScale: func() float64 { return 1 }}
	if w.Pattern == "random" {
		g.weights = slices.Sorted(maps.Keys(w.PatternWeights))
		var sum float64
		for _, p := range g.weights {
			x := w.PatternWeights[p]
			g.meanSize += x * float64(g.size(p))
			sum += x
		}
		g.meanSize /= sum
	} else {
		g.meanSize = float64(g.size(w.Pattern))
	}
	g.next = g.gap(0)
	if w.HighRate > 0 {
		g.nextHigh = g.expo(w.HighRate)
	} else {
		g.nextHigh = math.MaxInt64
	}
	return g
}

// size returns the units in a group of pattern p.
func (g *generator) size(p string) int {
	switch p {
	case "single", "circular":
		return 2
	case "chain":
		return g.w.ChainDepth
	case "fan_out", "fan_in":
		return 1 + max(g.w.FanOutWidth, 1)*boolInt(p == "fan_out") + max(g.w.FanInWidth, 1)*boolInt(p == "fan_in")
	case "diamond":
		return 4
	case "complex":
		return 5
	}
	return 1
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// rate returns the units per second at t.
func (g *generator) rate(t time.Duration) float64 {
	r := g.w.Rate * g.rateScale()
	if g.w.BurstLength > 0 && t >= g.w.BurstAt.D() && t < g.w.BurstAt.D()+g.w.BurstLength.D() {
		r *= g.w.BurstFactor
	}
	return r
}

func (g *generator) expo(perSecond float64) time.Duration {
	if perSecond <= 0 {
		return time.Hour
	}
	return max(time.Millisecond, time.Duration(g.rng.ExpFloat64()/perSecond*float64(time.Second)).Round(time.Millisecond))
}

// gap draws the time from t to the next group.
func (g *generator) gap(t time.Duration) time.Duration {
	return t + g.expo(g.rate(t)/g.meanSize)
}

// peek returns when the next group or high-priority unit arrives.
func (g *generator) peek() time.Duration { return min(g.next, g.nextHigh) }

// pop returns the next group and draws the one after it.
func (g *generator) pop() group {
	if g.nextHigh < g.next {
		at := g.nextHigh
		g.nextHigh = at + g.expo(g.w.HighRate)
		gr := group{at: at, pattern: "none", order: "natural"}
		gr.units = []unitSpec{{id: fmt.Sprintf("h%07d", g.units), task: g.task(), priority: 1}}
		return gr
	}
	at := g.next
	g.next = g.gap(at)
	p := g.w.Pattern
	if p == "random" {
		var sum float64
		for _, q := range g.weights {
			sum += g.w.PatternWeights[q]
		}
		x := g.rng.Float64() * sum
		for _, q := range g.weights {
			if x -= g.w.PatternWeights[q]; x < 0 {
				p = q
				break
			}
		}
		if p == "random" {
			p = g.weights[len(g.weights)-1]
		}
	}
	gr := group{at: at, pattern: p, units: g.build(p)}
	gr.order = g.w.Order
	if gr.order == "mixed" {
		gr.order = []string{"natural", "reversed", "shuffled"}[g.rng.IntN(3)]
	}
	switch gr.order {
	case "reversed":
		slices.Reverse(gr.units)
	case "shuffled":
		g.rng.Shuffle(len(gr.units), func(i, j int) { gr.units[i], gr.units[j] = gr.units[j], gr.units[i] })
	}
	g.groups++
	return gr
}

func (g *generator) task() string {
	t := g.w.TaskTypes[g.units%len(g.w.TaskTypes)]
	g.units++
	return t
}

// build makes a group's units in dependency order; unit i of group n is
// "gNNNNNNN.i".
func (g *generator) build(p string) []unitSpec {
	n := g.groups
	var us []unitSpec
	add := func(deps ...int) {
		u := unitSpec{id: fmt.Sprintf("g%07d.%d", n, len(us)), task: g.task()}
		if g.w.Keys > 0 {
			u.target = fmt.Sprintf("key-%02d", g.rng.IntN(g.w.Keys))
		}
		if g.w.HighFraction > 0 && g.rng.Float64() < g.w.HighFraction {
			u.priority = 1
		}
		for _, d := range deps {
			u.deps = append(u.deps, us[d].id)
		}
		us = append(us, u)
	}
	switch p {
	case "none":
		add()
	case "single":
		add()
		add(0)
	case "chain":
		add()
		for i := 1; i < g.w.ChainDepth; i++ {
			add(i - 1)
		}
	case "fan_out":
		add()
		for range g.w.FanOutWidth {
			add(0)
		}
	case "fan_in":
		var all []int
		for i := range g.w.FanInWidth {
			add()
			all = append(all, i)
		}
		add(all...)
	case "diamond":
		add()
		add(0)
		add(0)
		add(1, 2)
	case "complex":
		add()     // A
		add(0)    // B <- A
		add(0)    // C <- A
		add(2)    // D <- C
		add(1, 3) // E <- B, D
	case "circular":
		add()
		add(0)
		us[0].deps = []string{us[1].id} // A <- B <- A
	}
	return us
}

// submissions turns a group into runcue submissions.
func (gr group) submissions() []runcue.Submission {
	subs := make([]runcue.Submission, len(gr.units))
	for i, u := range gr.units {
		subs[i] = runcue.Submission{Task: u.task, ID: u.id, Target: u.id, DependsOn: u.deps}
		if u.target != "" {
			subs[i].Target = u.target
		}
		if u.priority != 0 {
			subs[i].Params = prioParams{P: u.priority}
		}
	}
	return subs
}

// prioParams are a unit's params: its priority.
type prioParams struct {
	P int `json:"p"`
}
