package appliance

import (
	"sort"
	"testing"
)

func TestTSCCalResult(t *testing.T) {
	const cpu = 2_600_000 // cycles per ms of a 2.6 GHz TSC
	pitTicks := uint64(PITHz * 40 / 1000)
	span := uint64(cpu) * 40 * pitTicks * 1000 / (PITHz * 40) // exactly 40 ms worth of those ticks
	cases := []struct {
		name                  string
		span, ticks, brackets uint64
		num, den              uint64
		want                  uint64
		ok                    bool
	}{
		{"pit", span, pitTicks, 200, PITHz, 1000, cpu - 1, true},
		{"hpet 14.318 MHz", 104_000_000, 572_727, 100, FemtosecondsPerMS, 69_841_279, 2_600_000, true},
		// A pause of 3 ms at one end is a bracket of 7.8 M cycles: refused,
		// where polling for the end would have counted it as 40 ms.
		{"pause at an end", span, pitTicks, 3 * cpu, PITHz, 1000, 0, false},
		{"brackets at the bound", 1 << 20, 1000, 1 << 10, PITHz, 1000, (1 << 20) * PITHz / 1_000_000, true},
		{"brackets past the bound", 1 << 20, 1000, 1<<10 + 1, PITHz, 1000, 0, false},
		{"no ticks", span, 0, 0, PITHz, 1000, 0, false},
		{"no den", span, 10, 0, PITHz, 0, 0, false},
		{"divisor overflows", span, 1 << 40, 0, PITHz, 1 << 30, 0, false},
		{"quotient overflows", ^uint64(0), 1, 0, FemtosecondsPerMS, 1, 0, false},
		{"zero result", 1, 2000, 0, PITHz, 1000, 0, false},
	}
	for _, c := range cases {
		got, ok := TSCCalResult(c.span, c.ticks, c.brackets, c.num, c.den)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: TSCCalResult(%d, %d, %d, %d, %d) = %d, %v; want %d, %v",
				c.name, c.span, c.ticks, c.brackets, c.num, c.den, got, ok, c.want, c.ok)
		}
	}
}

func TestMedian3(t *testing.T) {
	rng := &splitmix64{state: 7}
	for i := 0; i < 10000; i++ {
		v := []uint64{rng.next() % 5, rng.next() % 5, rng.next() % 5}
		got := Median3(v[0], v[1], v[2])
		sort.Slice(v, func(a, b int) bool { return v[a] < v[b] })
		if got != v[1] {
			t.Fatalf("Median3 of %v = %d", v, got)
		}
	}
}
