package auth

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/etcd/api/v3/authpb"
)

// TestBackendPersists: what a write transaction puts in the apply batch is
// what a backend opened over the committed store reads (users, roles, the
// enabled flag, the revision), nothing is written outside a batch during
// an apply, a delete is persisted too, and DumpState/WriteRestoredState
// carry the state into another store.
func TestBackendPersists(t *testing.T) {
	open := func() *pebble.DB {
		db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	db := open()
	be, err := newBackend(db, 2)
	if err != nil {
		t.Fatal(err)
	}
	b := db.NewBatch()
	be.setBatch(b)
	tx := be.BatchTx()
	tx.Lock()
	tx.UnsafePutUser(&authpb.User{Name: []byte("alice"), Password: []byte("h"), Roles: []string{"r"}})
	tx.UnsafePutUser(&authpb.User{Name: []byte("bob")})
	tx.UnsafePutRole(&authpb.Role{Name: []byte("r"), KeyPermission: []*authpb.Permission{{PermType: authpb.READ, Key: []byte("/a/"), RangeEnd: []byte("/a0")}}})
	tx.UnsafeSaveAuthEnabled(true)
	tx.UnsafeSaveAuthRevision(7)
	tx.UnsafeDeleteUser("bob")
	tx.Unlock()
	be.setBatch(nil)
	if again, _ := newBackend(db, 2); again.UnsafeGetUser("alice") != nil {
		t.Fatal("an apply's writes reached the store before its batch committed")
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	check := func(be *backend) {
		t.Helper()
		u := be.GetUser("alice")
		if u == nil || string(u.Password) != "h" || len(u.Roles) != 1 || u.Roles[0] != "r" {
			t.Fatalf("alice: %v", u)
		}
		if be.GetUser("bob") != nil {
			t.Fatal("a deleted user came back")
		}
		r := be.GetRole("r")
		if r == nil || len(r.KeyPermission) != 1 || string(r.KeyPermission[0].RangeEnd) != "/a0" {
			t.Fatalf("role r: %v", r)
		}
		if !be.UnsafeReadAuthEnabled() || be.UnsafeReadAuthRevision() != 7 {
			t.Fatalf("enabled %v, revision %d", be.UnsafeReadAuthEnabled(), be.UnsafeReadAuthRevision())
		}
	}
	reopened, err := newBackend(db, 2)
	if err != nil {
		t.Fatal(err)
	}
	check(reopened)
	// A record handed out is a copy.
	reopened.GetUser("alice").Roles[0] = "x"
	check(reopened)

	records, err := DumpState(db, 2)
	if err != nil {
		t.Fatal(err)
	}
	other := open()
	ob := other.NewBatch()
	if err := WriteRestoredState(ob, 2, records); err != nil {
		t.Fatal(err)
	}
	if err := ob.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	restored, err := newBackend(other, 2)
	if err != nil {
		t.Fatal(err)
	}
	check(restored)
}
