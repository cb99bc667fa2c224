package main

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// progress draws a one-line progress bar on stderr, at most ten times a
// second.
type progress struct {
	what  string
	start time.Time
	last  time.Time
	drawn bool
}

func newProgress(what string) *progress { return &progress{what: what, start: time.Now()} }

func (p *progress) set(done, total int64) {
	if time.Since(p.last) < 100*time.Millisecond && done < total {
		return
	}
	p.last = time.Now()
	p.drawn = true
	const width = 30
	bar := strings.Repeat("?", width)
	pct := ""
	if total > 0 {
		f := min(float64(done)/float64(total), 1)
		n := int(f * width)
		bar = strings.Repeat("=", n) + strings.Repeat(" ", width-n)
		pct = fmt.Sprintf(" %3.0f%%", 100*f)
	}
	fmt.Fprintf(os.Stderr, "\r%s [%s]%s %d/%d %s", p.what, bar, pct, done, total, time.Since(p.start).Round(100*time.Millisecond))
}

func (p *progress) done() {
	if p.drawn {
		fmt.Fprintln(os.Stderr)
	}
}
