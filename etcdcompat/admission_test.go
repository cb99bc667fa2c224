package etcdcompat

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestAdmitWrite: with ActiveWrites 2, two writes are active at once and a
// third waits until one of them finishes; a write whose context ends while
// it waits fails with the context's gRPC code and takes no slot; the wait
// of every admitted write is in brain_write_admission_wait_seconds.
func TestAdmitWrite(t *testing.T) {
	s := New(Config{ActiveWrites: 2, Registerer: prometheus.NewRegistry()})
	ctx := context.Background()
	release1, err := s.admitWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release2, err := s.admitWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.admitWrite(short); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a write waiting past its deadline: %v, want code DeadlineExceeded", err)
	}
	canceled, cancel2 := context.WithCancel(ctx)
	cancel2()
	done := make(chan error, 1)
	go func() { _, err := s.admitWrite(canceled); done <- err }()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("a write whose client went away: %v, want code Canceled", err)
	}

	admitted := make(chan func(), 1)
	go func() {
		release, err := s.admitWrite(ctx)
		if err != nil {
			t.Error(err)
			close(admitted)
			return
		}
		admitted <- release
	}()
	select {
	case <-admitted:
		t.Fatal("a third write became active while two were")
	case <-time.After(100 * time.Millisecond):
	}
	release1()
	select {
	case release3, ok := <-admitted:
		if !ok {
			t.FailNow()
		}
		release3()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting write was not admitted when a slot was given back")
	}
	release2()

	var m dto.Metric
	if err := s.admitWait.Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	if h.GetSampleCount() != 3 || h.GetSampleSum() < 0.1 {
		t.Fatalf("brain_write_admission_wait_seconds: %d samples summing to %gs, want 3 (the admitted writes), at least 0.1s", h.GetSampleCount(), h.GetSampleSum())
	}
	// Both slots are free again: two writes are admitted at once.
	again, cancel3 := context.WithTimeout(ctx, time.Second)
	defer cancel3()
	for i := 0; i < 2; i++ {
		if _, err := s.admitWrite(again); err != nil {
			t.Fatalf("slot %d not given back: %v", i+1, err)
		}
	}
}

// TestAdmitWriteUnlimited: without ActiveWrites no write waits.
func TestAdmitWriteUnlimited(t *testing.T) {
	s := New(Config{})
	for i := 0; i < 1000; i++ {
		if _, err := s.admitWrite(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
