package auth

import (
	"encoding/binary"
	"fmt"
	"sort"
	"sync"

	"github.com/brainkv/brain/engine"
	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/etcd/api/v3/authpb"
	etcdauth "go.etcd.io/etcd/server/v3/auth"
)

// backend is etcd's AuthBackend over the meta group's key range: the
// state is held in memory and written, by the meta group's apply, into its
// batch (so it commits with the entry's applied index, and raft snapshots
// of the meta group carry it).
//
// Keys, under engine.GroupKey(metaGroup, "auth/"): "e" the enabled flag
// (one byte), "r" the auth revision (big-endian uint64), "u/"+name a user
// and "o/"+name a role (authpb, marshalled).
type backend struct {
	db     *pebble.DB
	prefix []byte

	// txMu serialises write transactions (BatchTx), rmu read ones
	// (ReadTx) against them: etcd's store holds one or the other around
	// its Unsafe calls.
	txMu sync.Mutex
	rmu  sync.RWMutex

	mu struct {
		sync.Mutex
		enabled bool
		rev     uint64
		users   map[string]*authpb.User
		roles   map[string]*authpb.Role
		// batch receives the writes of the entry being applied; nil
		// outside an apply (the store's creation writes revision 1 to the
		// database directly: every node does the same).
		batch *pebble.Batch
	}
}

func newBackend(db *pebble.DB, metaGroup uint64) (*backend, error) {
	b := &backend{db: db, prefix: engine.GroupKey(metaGroup, "auth/")}
	return b, b.load()
}

func (b *backend) key(s string) []byte { return append(append([]byte(nil), b.prefix...), s...) }

// load reads the state from the database.
func (b *backend) load() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.enabled, b.mu.rev = false, 0
	b.mu.users, b.mu.roles = map[string]*authpb.User{}, map[string]*authpb.Role{}
	it, err := b.db.NewIter(&pebble.IterOptions{LowerBound: b.prefix, UpperBound: engine.PrefixEnd(b.prefix)})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k, v := string(it.Key()[len(b.prefix):]), it.Value()
		switch {
		case k == "e":
			b.mu.enabled = len(v) == 1 && v[0] == 1
		case k == "r" && len(v) == 8:
			b.mu.rev = binary.BigEndian.Uint64(v)
		case len(k) > 2 && k[:2] == "u/":
			u := &authpb.User{}
			if err := u.Unmarshal(v); err != nil {
				return fmt.Errorf("auth: corrupt user record %q: %w", k[2:], err)
			}
			b.mu.users[string(u.Name)] = u
		case len(k) > 2 && k[:2] == "o/":
			r := &authpb.Role{}
			if err := r.Unmarshal(v); err != nil {
				return fmt.Errorf("auth: corrupt role record %q: %w", k[2:], err)
			}
			b.mu.roles[string(r.Name)] = r
		}
	}
	return it.Error()
}

// setBatch directs writes to batch (nil: to the database directly).
func (b *backend) setBatch(batch *pebble.Batch) {
	b.mu.Lock()
	b.mu.batch = batch
	b.mu.Unlock()
}

// write sets (or, with v nil and del, deletes) key k; b.mu is held.
func (b *backend) writeLocked(k string, v []byte, del bool) {
	var err error
	switch {
	case b.mu.batch != nil && del:
		err = b.mu.batch.Delete(b.key(k), nil)
	case b.mu.batch != nil:
		err = b.mu.batch.Set(b.key(k), v, nil)
	case del:
		err = b.db.Delete(b.key(k), pebble.Sync)
	default:
		err = b.db.Set(b.key(k), v, pebble.Sync)
	}
	if err != nil {
		// As meta's apply does: a state machine that cannot write its
		// state must not go on as if it had.
		panic(fmt.Errorf("auth: write %q: %w", k, err))
	}
}

// etcd's AuthBackend.

func (b *backend) CreateAuthBuckets()            {}
func (b *backend) ForceCommit()                  {}
func (b *backend) ReadTx() etcdauth.AuthReadTx   { return readTx{b} }
func (b *backend) BatchTx() etcdauth.AuthBatchTx { return batchTx{readTx{b}} }

func (b *backend) GetUser(name string) *authpb.User {
	b.rmu.RLock()
	defer b.rmu.RUnlock()
	return b.UnsafeGetUser(name)
}

func (b *backend) GetAllUsers() []*authpb.User {
	b.rmu.RLock()
	defer b.rmu.RUnlock()
	return b.UnsafeGetAllUsers()
}

func (b *backend) GetRole(name string) *authpb.Role {
	b.rmu.RLock()
	defer b.rmu.RUnlock()
	return b.UnsafeGetRole(name)
}

func (b *backend) GetAllRoles() []*authpb.Role {
	b.rmu.RLock()
	defer b.rmu.RUnlock()
	return b.UnsafeGetAllRoles()
}

// hasUsers reports whether any user is defined.
func (b *backend) hasUsers() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.mu.users) > 0
}

// The Unsafe readers and writers; the records handed out are copies.

func (b *backend) UnsafeReadAuthEnabled() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.enabled
}

func (b *backend) UnsafeReadAuthRevision() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.rev
}

func (b *backend) UnsafeGetUser(name string) *authpb.User {
	b.mu.Lock()
	defer b.mu.Unlock()
	if u := b.mu.users[name]; u != nil {
		return cloneUser(u)
	}
	return nil
}

func (b *backend) UnsafeGetRole(name string) *authpb.Role {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.mu.roles[name]; r != nil {
		return cloneRole(r)
	}
	return nil
}

func (b *backend) UnsafeGetAllUsers() []*authpb.User {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*authpb.User, 0, len(b.mu.users))
	for _, u := range b.mu.users {
		out = append(out, cloneUser(u))
	}
	sort.Slice(out, func(i, j int) bool { return string(out[i].Name) < string(out[j].Name) })
	return out
}

func (b *backend) UnsafeGetAllRoles() []*authpb.Role {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*authpb.Role, 0, len(b.mu.roles))
	for _, r := range b.mu.roles {
		out = append(out, cloneRole(r))
	}
	sort.Slice(out, func(i, j int) bool { return string(out[i].Name) < string(out[j].Name) })
	return out
}

func (b *backend) UnsafeSaveAuthEnabled(enabled bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.enabled = enabled
	v := []byte{0}
	if enabled {
		v[0] = 1
	}
	b.writeLocked("e", v, false)
}

func (b *backend) UnsafeSaveAuthRevision(rev uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.rev = rev
	b.writeLocked("r", binary.BigEndian.AppendUint64(nil, rev), false)
}

func (b *backend) UnsafePutUser(u *authpb.User) {
	v, err := u.Marshal()
	if err != nil {
		panic(fmt.Errorf("auth: marshal user: %w", err))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.users[string(u.Name)] = cloneUser(u)
	b.writeLocked("u/"+string(u.Name), v, false)
}

func (b *backend) UnsafeDeleteUser(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.mu.users, name)
	b.writeLocked("u/"+name, nil, true)
}

func (b *backend) UnsafePutRole(r *authpb.Role) {
	v, err := r.Marshal()
	if err != nil {
		panic(fmt.Errorf("auth: marshal role: %w", err))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.roles[string(r.Name)] = cloneRole(r)
	b.writeLocked("o/"+string(r.Name), v, false)
}

func (b *backend) UnsafeDeleteRole(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.mu.roles, name)
	b.writeLocked("o/"+name, nil, true)
}

func cloneUser(u *authpb.User) *authpb.User {
	c := *u
	c.Name = append([]byte(nil), u.Name...)
	c.Password = append([]byte(nil), u.Password...)
	c.Roles = append([]string(nil), u.Roles...)
	if u.Options != nil {
		o := *u.Options
		c.Options = &o
	}
	return &c
}

func cloneRole(r *authpb.Role) *authpb.Role {
	c := *r
	c.Name = append([]byte(nil), r.Name...)
	c.KeyPermission = make([]*authpb.Permission, len(r.KeyPermission))
	for i, p := range r.KeyPermission {
		pc := *p
		pc.Key = append([]byte(nil), p.Key...)
		pc.RangeEnd = append([]byte(nil), p.RangeEnd...)
		c.KeyPermission[i] = &pc
	}
	return &c
}

type readTx struct{ b *backend }

func (t readTx) RLock()   { t.b.rmu.RLock() }
func (t readTx) RUnlock() { t.b.rmu.RUnlock() }

func (t readTx) UnsafeReadAuthEnabled() bool         { return t.b.UnsafeReadAuthEnabled() }
func (t readTx) UnsafeReadAuthRevision() uint64      { return t.b.UnsafeReadAuthRevision() }
func (t readTx) UnsafeGetUser(n string) *authpb.User { return t.b.UnsafeGetUser(n) }
func (t readTx) UnsafeGetRole(n string) *authpb.Role { return t.b.UnsafeGetRole(n) }
func (t readTx) UnsafeGetAllUsers() []*authpb.User   { return t.b.UnsafeGetAllUsers() }
func (t readTx) UnsafeGetAllRoles() []*authpb.Role   { return t.b.UnsafeGetAllRoles() }

type batchTx struct{ readTx }

// Lock takes the write lock and, against readers, the read lock too: a
// reader never sees a write transaction half done.
func (t batchTx) Lock() {
	t.b.txMu.Lock()
	t.b.rmu.Lock()
}

func (t batchTx) Unlock() {
	t.b.rmu.Unlock()
	t.b.txMu.Unlock()
}

func (t batchTx) UnsafeSaveAuthEnabled(enabled bool) { t.b.UnsafeSaveAuthEnabled(enabled) }
func (t batchTx) UnsafeSaveAuthRevision(rev uint64)  { t.b.UnsafeSaveAuthRevision(rev) }
func (t batchTx) UnsafePutUser(u *authpb.User)       { t.b.UnsafePutUser(u) }
func (t batchTx) UnsafeDeleteUser(n string)          { t.b.UnsafeDeleteUser(n) }
func (t batchTx) UnsafePutRole(r *authpb.Role)       { t.b.UnsafePutRole(r) }
func (t batchTx) UnsafeDeleteRole(n string)          { t.b.UnsafeDeleteRole(n) }

var _ etcdauth.AuthBackend = (*backend)(nil)

// DumpState returns the auth state of the meta group metaGroup as r holds
// it: each record's key (within the auth state) and value, for backups.
func DumpState(r pebble.Reader, metaGroup uint64) ([][2][]byte, error) {
	prefix := engine.GroupKey(metaGroup, "auth/")
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: engine.PrefixEnd(prefix)})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out [][2][]byte
	for it.First(); it.Valid(); it.Next() {
		out = append(out, [2][]byte{append([]byte(nil), it.Key()[len(prefix):]...), append([]byte(nil), it.Value()...)})
	}
	return out, it.Error()
}

// WriteRestoredState writes auth records from a backup (DumpState's) into
// the meta group metaGroup's state.
func WriteRestoredState(b *pebble.Batch, metaGroup uint64, records [][2][]byte) error {
	prefix := engine.GroupKey(metaGroup, "auth/")
	for _, r := range records {
		if err := b.Set(append(append([]byte(nil), prefix...), r[0]...), r[1], nil); err != nil {
			return err
		}
	}
	return nil
}
