package main

import (
	"strconv"
	"time"
)

// msDuration is a duration flag that also accepts a bare number of unit
// (milliseconds, as etcd's --heartbeat-interval and --election-timeout
// take; seconds for --auth-token-ttl).
type msDuration struct {
	d    *time.Duration
	unit time.Duration // 0: milliseconds
}

func (m msDuration) String() string {
	if m.d == nil || *m.d == 0 {
		return "0"
	}
	return m.d.String()
}

func (m msDuration) Set(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		unit := m.unit
		if unit == 0 {
			unit = time.Millisecond
		}
		*m.d = time.Duration(n) * unit
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*m.d = d
	return nil
}

func (m msDuration) Type() string { return "duration" }
