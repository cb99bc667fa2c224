// Package failing has the transformer and codec wrappers upstream's
// storage tests switch into failure to exercise error paths; the etcd3 and
// cacher test packages share them.
package failing

import (
	"context"
	"errors"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage/value"
)

// Transformer fails reads once SetFailing(true) is called.
type Transformer struct {
	value.Transformer
	fail atomic.Bool
}

// SetFailing switches failure on or off.
func (t *Transformer) SetFailing(c bool) { t.fail.Store(c) }

// TransformFromStorage fails while failing is on.
func (t *Transformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) (out []byte, stale bool, err error) {
	if t.fail.Load() {
		return nil, false, errors.New("synthetic error")
	}
	return t.Transformer.TransformFromStorage(ctx, data, dataCtx)
}

// Codec fails decodes once SetFailing(true) is called.
type Codec struct {
	runtime.Codec
	fail atomic.Bool
}

// SetFailing switches failure on or off.
func (c *Codec) SetFailing(f bool) { c.fail.Store(f) }

// Decode fails while failing is on.
func (c *Codec) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if c.fail.Load() {
		return nil, nil, errors.New("synthetic error")
	}
	return c.Codec.Decode(data, defaults, into)
}
