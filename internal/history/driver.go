package history

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Do performs in through kv as client, records it, and returns the output.
// Requests time out after timeout; failures are recorded as unknown.
func Do(rec *Recorder, kv clientv3.KV, client int, in Input, timeout time.Duration) Output {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	op := Op{Client: client, In: in, Call: rec.Now()}
	var out Output
	switch in.Kind {
	case Get:
		resp, err := kv.Get(ctx, in.Key)
		if out = unknown(err); err == nil {
			out.Rev, out.Member = resp.Header.Revision, resp.Header.MemberId
			if len(resp.Kvs) == 1 {
				out.Exists, out.Value, out.Mod = true, string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision
			}
		}
	case Put:
		resp, err := kv.Put(ctx, in.Key, in.Value)
		if out = unknown(err); err == nil {
			out.Rev, out.OK, out.Member = resp.Header.Revision, true, resp.Header.MemberId
		}
	case CAS:
		resp, err := kv.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(in.Key), "=", in.ExpectMod)).
			Then(clientv3.OpPut(in.Key, in.Value)).
			Else(clientv3.OpGet(in.Key)).Commit()
		if out = unknown(err); err == nil {
			out.Rev, out.OK, out.Member = resp.Header.Revision, resp.Succeeded, resp.Header.MemberId
		}
	case Delete:
		resp, err := kv.Delete(ctx, in.Key)
		if out = unknown(err); err == nil {
			out.Rev, out.OK, out.Member = resp.Header.Revision, resp.Deleted > 0, resp.Header.MemberId
		}
	}
	op.Out = out
	op.Return = rec.Now()
	rec.Add(op)
	return out
}

func unknown(err error) Output {
	if err == nil {
		return Output{}
	}
	return Output{Unknown: true, Err: err.Error()}
}

// RecordWatch watches w's range from w.Start on c until ctx ends or the
// stream ends, recording responses into w, and asks for progress every
// progressEvery (0: never). It returns when done; w.Complete is the highest
// revision the stream is known to have delivered everything up to.
func RecordWatch(ctx context.Context, c *clientv3.Client, w *Watch, progressEvery time.Duration) error {
	return recordWatchFrom(ctx, c, w, w.Start, progressEvery)
}

func recordWatchFrom(ctx context.Context, c *clientv3.Client, w *Watch, start int64, progressEvery time.Duration) error {
	ctx = clientv3.WithRequireLeader(ctx)
	opts := []clientv3.OpOption{clientv3.WithRev(start), clientv3.WithProgressNotify()}
	switch w.End {
	case "":
	case "\x00":
		opts = append(opts, clientv3.WithFromKey())
	default:
		opts = append(opts, clientv3.WithRange(w.End))
	}
	if w.PrevKV {
		opts = append(opts, clientv3.WithPrevKV())
	}
	wch := c.Watch(ctx, w.Key, opts...)
	var tick <-chan time.Time
	if progressEvery > 0 {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			_ = c.RequestProgress(ctx)
		case wr, ok := <-wch:
			if !ok {
				return nil
			}
			if err := wr.Err(); err != nil {
				return err
			}
			r := Response{Header: wr.Header.Revision, Progress: wr.IsProgressNotify()}
			for _, ev := range wr.Events {
				e := Event{Delete: ev.Type == clientv3.EventTypeDelete, Key: string(ev.Kv.Key), Value: string(ev.Kv.Value),
					Rev: ev.Kv.ModRevision, Create: ev.Kv.CreateRevision, Ver: ev.Kv.Version}
				if ev.PrevKv != nil {
					e.Prev = &PrevKV{Value: string(ev.PrevKv.Value), Mod: ev.PrevKv.ModRevision}
				}
				r.Events = append(r.Events, e)
			}
			w.mu.Lock()
			for _, e := range r.Events {
				w.Complete = max(w.Complete, e.Rev)
			}
			if r.Progress {
				w.Complete = max(w.Complete, r.Header)
			}
			w.Resps = append(w.Resps, r)
			w.mu.Unlock()
		}
	}
}

// RecordResumingWatch is RecordWatch over several endpoints: when the
// stream breaks (its node went away), it resumes on the next client from
// the revision after the last one it saw, as a client whose node died
// would, and records in w.Ended a stream that ended with an error (etcd's
// client retries a broken connection itself: what ends a stream is an
// error such as "no leader", which kube-apiserver answers by re-listing).
// It returns when ctx ends.
func RecordResumingWatch(ctx context.Context, clients []*clientv3.Client, w *Watch, progressEvery time.Duration) {
	for i := 0; ctx.Err() == nil; i++ {
		c := clients[i%len(clients)]
		w.mu.Lock()
		start := max(w.Start, w.Complete+1)
		if i > 0 {
			w.Resumed = append(w.Resumed, start)
		}
		w.mu.Unlock()
		if err := recordWatchFrom(ctx, c, w, start, progressEvery); err != nil && ctx.Err() == nil {
			w.mu.Lock()
			w.Ended = append(w.Ended, StreamEnd{At: time.Now(), Client: i % len(clients), Err: err.Error()})
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}
