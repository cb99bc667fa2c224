package server_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"
)

// authScript runs etcd's auth scenarios against a cluster's endpoints and
// returns, per step, what a client saw (answers without headers, or the
// error): users, roles, key and prefix and range permissions, what a user
// may read, write and watch, revoked roles and deleted users, wrong
// passwords, admin-only calls, a simple token's expiry, auth disable.
// Clients are spread over the endpoints.
func authScript(t *testing.T, eps []string, tokenTTL time.Duration) []string {
	t.Helper()
	var out []string
	note := func(step string, v any) {
		switch x := v.(type) {
		case error:
			msg := x.Error()
			if i := strings.Index(msg, "etcdserver: "); i >= 0 {
				msg = msg[i:]
			}
			out = append(out, step+": error: "+msg)
		default:
			out = append(out, fmt.Sprintf("%s: %v", step, withoutHeader(x)))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := 0
	client := func(user, password string) (*clientv3.Client, error) {
		n++
		ep := eps[n%len(eps)]
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, Username: user, Password: password,
			DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
	must := func(c *clientv3.Client, err error) *clientv3.Client {
		t.Helper()
		if err != nil {
			t.Fatalf("client: %v", err)
		}
		return c
	}
	result := func(v any, err error) any {
		if err != nil {
			return err
		}
		return v
	}
	get := func(c *clientv3.Client, key string, opts ...clientv3.OpOption) any {
		r, err := c.Get(ctx, key, opts...)
		if err != nil {
			return err
		}
		var kvs []string
		for _, kv := range r.Kvs {
			kvs = append(kvs, string(kv.Key)+"="+string(kv.Value))
		}
		return kvs
	}
	put := func(c *clientv3.Client, key, val string, opts ...clientv3.OpOption) any {
		_, err := c.Put(ctx, key, val, opts...)
		return result("ok", err)
	}
	watch := func(c *clientv3.Client, key string, opts ...clientv3.OpOption) any {
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		defer wcancel()
		wch := c.Watch(wctx, key, append(opts, clientv3.WithCreatedNotify())...)
		select {
		case r, ok := <-wch:
			if !ok {
				return "closed"
			}
			if r.Canceled {
				return fmt.Sprintf("canceled: %v", r.Err())
			}
			return "created"
		case <-time.After(10 * time.Second):
			return "no answer"
		}
	}
	anon := must(client("", ""))
	note("status", result(anon.AuthStatus(ctx)))
	note("enable without root", result(anon.AuthEnable(ctx)))
	note("add root", result(anon.UserAdd(ctx, "root", "rootpw")))
	note("enable without root role", result(anon.AuthEnable(ctx)))
	note("grant root", result(anon.UserGrantRole(ctx, "root", "root")))
	note("put before enable", put(anon, "/a/1", "v1"))
	note("put /b/1", put(anon, "/b/1", "v1"))
	note("enable", result(anon.AuthEnable(ctx)))
	note("anonymous put", put(anon, "/a/2", "v2"))
	note("anonymous get", get(anon, "/a/1"))
	note("anonymous watch", watch(anon, "/a/", clientv3.WithPrefix()))
	_, err := client("root", "wrong")
	note("root with a wrong password", err)
	root := must(client("root", "rootpw"))
	note("root get", get(root, "/", clientv3.WithPrefix()))
	note("add alice", result(root.UserAdd(ctx, "alice", "alicepw")))
	note("add alice again", result(root.UserAdd(ctx, "alice", "x")))
	note("add role", result(root.RoleAdd(ctx, "ra")))
	note("grant /a/ prefix", result(root.RoleGrantPermission(ctx, "ra", "/a/", clientv3.GetPrefixRangeEnd("/a/"), clientv3.PermissionType(authpb.READWRITE))))
	note("grant read /c/x", result(root.RoleGrantPermission(ctx, "ra", "/c/x", "", clientv3.PermissionType(authpb.READ))))
	note("grant write [/d/b, /d/d)", result(root.RoleGrantPermission(ctx, "ra", "/d/b", "/d/d", clientv3.PermissionType(authpb.WRITE))))
	note("grant missing role", result(root.UserGrantRole(ctx, "alice", "nope")))
	note("grant alice ra", result(root.UserGrantRole(ctx, "alice", "ra")))
	note("role get", fmtRole(root.RoleGet(ctx, "ra")))
	note("user get", fmtUser(root.UserGet(ctx, "alice")))
	note("user list", fmtList(root.UserList(ctx)))
	note("role list", fmtRoles(root.RoleList(ctx)))
	alice := must(client("alice", "alicepw"))
	note("alice get /a/1", get(alice, "/a/1"))
	note("alice get /a/ prefix", get(alice, "/a/", clientv3.WithPrefix()))
	note("alice get /b/1", get(alice, "/b/1"))
	note("alice get /", get(alice, "/", clientv3.WithPrefix()))
	note("alice put /a/3", put(alice, "/a/3", "v3"))
	note("alice put /b/3", put(alice, "/b/3", "v3"))
	note("alice put /c/x", put(alice, "/c/x", "v"))
	note("root put /c/x", put(root, "/c/x", "cx"))
	note("alice get /c/x", get(alice, "/c/x"))
	note("alice get /c/ prefix", get(alice, "/c/", clientv3.WithPrefix()))
	note("alice put /d/c", put(alice, "/d/c", "v"))
	note("alice put /d/d", put(alice, "/d/d", "v"))
	note("alice get /d/c", get(alice, "/d/c"))
	note("alice put /a/4 prev kv", put(alice, "/a/4", "v", clientv3.WithPrevKV()))
	_, err = alice.Delete(ctx, "/a/", clientv3.WithPrefix())
	note("alice delete /a/ prefix", result("ok", err))
	_, err = alice.Delete(ctx, "/b/1")
	note("alice delete /b/1", result("ok", err))
	tr, err := alice.Txn(ctx).If(clientv3.Compare(clientv3.Value("/b/1"), "=", "v1")).Then(clientv3.OpPut("/a/5", "v")).Commit()
	note("alice txn compare /b/1", result(tr != nil && tr.Succeeded, err))
	tr, err = alice.Txn(ctx).If(clientv3.Compare(clientv3.Version("/a/5"), "=", 0)).Then(clientv3.OpPut("/a/5", "v"), clientv3.OpGet("/c/x")).Commit()
	note("alice txn on her keys", result(tr != nil && tr.Succeeded, err))
	tr, err = alice.Txn(ctx).Then(clientv3.OpPut("/a/6", "v"), clientv3.OpPut("/b/6", "v")).Commit()
	note("alice txn writing /b/6", result(tr != nil && tr.Succeeded, err))
	note("alice watch /a/", watch(alice, "/a/", clientv3.WithPrefix()))
	note("alice watch /b/", watch(alice, "/b/", clientv3.WithPrefix()))
	note("alice watch everything", watch(alice, "", clientv3.WithFromKey()))
	note("alice user get self", fmtUser(alice.UserGet(ctx, "alice")))
	note("alice user get root", fmtUser(alice.UserGet(ctx, "root")))
	note("alice role get ra", fmtRole(alice.RoleGet(ctx, "ra")))
	note("alice user list", fmtList(alice.UserList(ctx)))
	note("alice auth status", result(alice.AuthStatus(ctx)))
	note("alice add user", result(alice.UserAdd(ctx, "mallory", "x")))
	note("alice disable auth", result(alice.AuthDisable(ctx)))
	st, err := alice.Status(ctx, alice.Endpoints()[0])
	note("alice status", result(st != nil, err))
	note("alice alarm list", fmtAlarms(alice.AlarmList(ctx)))
	note("alice defragment", result(alice.Defragment(ctx, alice.Endpoints()[0])))
	note("alice member add", result(alice.MemberAdd(ctx, []string{"http://127.0.0.1:1"})))
	lg, err := alice.Grant(ctx, 60)
	note("alice lease grant", result(lg != nil, err))
	if lg != nil {
		note("alice put /a/l with lease", put(alice, "/a/l", "v", clientv3.WithLease(lg.ID)))
		note("root put /b/l with alice's lease", put(root, "/b/l", "v", clientv3.WithLease(lg.ID)))
		note("alice put /a/m with the lease now", put(alice, "/a/m", "v", clientv3.WithLease(lg.ID)))
		ttl, err := alice.TimeToLive(ctx, lg.ID, clientv3.WithAttachedKeys())
		note("alice lease keys", result(ttl != nil && len(ttl.Keys) > 0, err))
		_, err = alice.Revoke(ctx, lg.ID)
		note("alice revoke", result("ok", err))
		_, err = root.Revoke(ctx, lg.ID)
		note("root revoke", result("ok", err))
	}
	lg, err = anon.Grant(ctx, 60)
	note("anonymous lease grant", result(lg != nil, err))
	note("change alice's password", result(root.UserChangePassword(ctx, "alice", "newpw")))
	_, err = client("alice", "alicepw")
	note("alice with the old password", err)
	alice2 := must(client("alice", "newpw"))
	note("alice with the new password", get(alice2, "/a/3"))
	note("revoke role permission", result(root.RoleRevokePermission(ctx, "ra", "/c/x", "")))
	note("alice get /c/x after revoke", get(alice2, "/c/x"))
	note("revoke alice ra", result(root.UserRevokeRole(ctx, "alice", "ra")))
	note("alice get /a/3 after revoke", get(alice2, "/a/3"))
	note("revoke again", result(root.UserRevokeRole(ctx, "alice", "ra")))
	note("delete role", result(root.RoleDelete(ctx, "ra")))
	note("delete missing role", result(root.RoleDelete(ctx, "ra")))
	note("delete alice", result(root.UserDelete(ctx, "alice")))
	note("deleted alice get", get(alice2, "/a/3"))
	note("revoke root from root", result(root.UserRevokeRole(ctx, "root", "root")))

	// A simple token lives tokenTTL unused: raw calls with one token.
	conn := testutil.Dial(t, eps[0])
	authc := pb.NewAuthClient(conn)
	ar, err := authc.Authenticate(ctx, &pb.AuthenticateRequest{Name: "root", Password: "rootpw"})
	if err != nil {
		t.Fatalf("authenticate root: %v", err)
	}
	kvOn := func(ep string) pb.KVClient { return pb.NewKVClient(testutil.Dial(t, ep)) }
	tctx := metadata.AppendToOutgoingContext(ctx, "token", ar.Token)
	_, err = kvOn(eps[len(eps)-1]).Range(tctx, &pb.RangeRequest{Key: []byte("/a/3")})
	note("token on another endpoint", result("ok", err))
	_, err = kvOn(eps[0]).Range(metadata.AppendToOutgoingContext(ctx, "token", "bogus.1"), &pb.RangeRequest{Key: []byte("/a/3")})
	note("bogus token", result("ok", err))
	// The token's TTL is measured in whole seconds by etcd's keeper:
	// waiting twice its TTL plus a tick, unused, expires it.
	time.Sleep(2*tokenTTL + time.Second)
	_, err = kvOn(eps[0]).Range(tctx, &pb.RangeRequest{Key: []byte("/a/3")})
	note("token after its TTL", result("ok", err))

	note("disable", result(root.AuthDisable(ctx)))
	note("anonymous put after disable", put(anon, "/b/9", "v"))
	note("status at the end", result(anon.AuthStatus(ctx)))
	return out
}

// withoutHeader formats a response without its header (revisions, IDs
// and terms differ between the systems).
func withoutHeader(v any) any {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return v
	}
	c := reflect.New(rv.Elem().Type())
	c.Elem().Set(rv.Elem())
	if h := c.Elem().FieldByName("Header"); h.IsValid() && h.CanSet() {
		h.Set(reflect.Zero(h.Type()))
	}
	return c.Interface()
}

func fmtUser(r *clientv3.AuthUserGetResponse, err error) any {
	if err != nil {
		return err
	}
	return r.Roles
}

func fmtRole(r *clientv3.AuthRoleGetResponse, err error) any {
	if err != nil {
		return err
	}
	var perms []string
	for _, p := range r.Perm {
		perms = append(perms, fmt.Sprintf("%s[%q,%q)", p.PermType, p.Key, p.RangeEnd))
	}
	return perms
}

func fmtList(r *clientv3.AuthUserListResponse, err error) any {
	if err != nil {
		return err
	}
	return r.Users
}

func fmtRoles(r *clientv3.AuthRoleListResponse, err error) any {
	if err != nil {
		return err
	}
	return r.Roles
}

func fmtAlarms(r *clientv3.AlarmResponse, err error) any {
	if err != nil {
		return err
	}
	return len(r.Alarms)
}

// TestAuthMatchesEtcd runs etcd's auth scenarios against etcd 3.6 and
// brain (one node, and three with the clients spread over them) and
// requires the same answer at every step.
func TestAuthMatchesEtcd(t *testing.T) {
	const ttl = time.Second
	etcdEPs := testutil.StartEtcdClusterWith(t, 1, func(c *embed.Config) { c.AuthTokenTTL = uint(ttl / time.Second) })
	want := authScript(t, etcdEPs, ttl)
	for _, nodes := range []int{1, 3} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			c := testutil.StartCluster(t, nodes, server.Config{AuthTokenTTL: ttl, BcryptCost: 4})
			var eps []string
			for i := range c.Nodes {
				eps = append(eps, testutil.Endpoint(c.Nodes[i]))
			}
			waitAllServing(t, eps)
			got := authScript(t, eps, ttl)
			for i := range max(len(want), len(got)) {
				var w, g string
				if i < len(want) {
					w = want[i]
				}
				if i < len(got) {
					g = got[i]
				}
				if w != g {
					t.Errorf("step %d:\n etcd:  %s\n brain: %s", i, w, g)
				}
			}
		})
	}
}

// waitAllServing waits until a put through every endpoint succeeds.
func waitAllServing(t *testing.T, eps []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ep := range eps {
		c := testutil.Client(t, ep)
		for {
			if _, err := c.Put(ctx, "/warmup", "x"); err == nil {
				break
			} else if ctx.Err() != nil {
				t.Fatalf("%s never served: %v", ep, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if _, err := c.Delete(ctx, "/warmup"); err != nil {
			t.Fatal(err)
		}
	}
}

// setUpAuth creates root and alice (readwrite on /a/) and enables auth
// through c, returning root's client options.
func setUpAuth(t *testing.T, ctx context.Context, c *clientv3.Client) {
	t.Helper()
	for _, step := range []func() error{
		func() error { _, err := c.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.UserAdd(ctx, "alice", "alicepw"); return err },
		func() error { _, err := c.RoleAdd(ctx, "ra"); return err },
		func() error {
			_, err := c.RoleGrantPermission(ctx, "ra", "/a/", clientv3.GetPrefixRangeEnd("/a/"), clientv3.PermissionType(authpb.READWRITE))
			return err
		},
		func() error { _, err := c.UserGrantRole(ctx, "alice", "ra"); return err },
		func() error { _, err := c.Put(ctx, "/a/1", "v1"); return err },
		func() error { _, err := c.Put(ctx, "/b/1", "v1"); return err },
		func() error { _, err := c.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkAuthState requires the state setUpAuth made through ep: anonymous
// calls refused, alice reads /a/ and not /b/, root reads everything.
func checkAuthState(t *testing.T, ctx context.Context, ep string) {
	t.Helper()
	dial := func(user, pw string) *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, Username: user, Password: pw, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatalf("%s on %s: %v", user, ep, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	anon := testutil.Client(t, ep)
	if _, err := anon.Get(ctx, "/a/1"); err == nil || !strings.Contains(err.Error(), "user name is empty") {
		t.Fatalf("anonymous get on %s: %v, want user name is empty", ep, err)
	}
	alice := dial("alice", "alicepw")
	if r, err := alice.Get(ctx, "/a/1"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("alice get /a/1 on %s: %v %v", ep, r, err)
	}
	if _, err := alice.Get(ctx, "/b/1"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("alice get /b/1 on %s: %v, want permission denied", ep, err)
	}
	root := dial("root", "rootpw")
	if r, err := root.Get(ctx, "/", clientv3.WithPrefix()); err != nil || len(r.Kvs) != 2 {
		t.Fatalf("root get / on %s: %v %v", ep, r, err)
	}
}

// TestAuthSurvivesRestartsAndBackups: the users, roles and the enabled
// flag are replicated state: every node of a 3-node cluster enforces them
// after all were restarted, and a backup (which needs the root role)
// restored into a new store carries them.
func TestAuthSurvivesRestartsAndBackups(t *testing.T) {
	c := testutil.StartCluster(t, 3, server.Config{BcryptCost: 4})
	var eps []string
	for i := range c.Nodes {
		eps = append(eps, testutil.Endpoint(c.Nodes[i]))
	}
	waitAllServing(t, eps)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	setUpAuth(t, ctx, testutil.Client(t, eps[0]))
	for _, ep := range eps {
		checkAuthState(t, ctx, ep)
	}
	for i := range c.Nodes {
		c.Stop(i)
	}
	for i := range c.Nodes {
		c.Start(i)
	}
	eps = eps[:0]
	for i := range c.Nodes {
		eps = append(eps, testutil.Endpoint(c.Nodes[i]))
	}
	for _, ep := range eps {
		checkAuthState(t, ctx, ep)
	}

	file := filepath.Join(t.TempDir(), "backup.db")
	if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: eps[:1]}, file); err == nil || !strings.Contains(err.Error(), "user name is empty") {
		t.Fatalf("an anonymous backup: %v, want user name is empty", err)
	}
	// A node that holds a replica of every partition serves backups
	// (after the restart, a node binds its replicas to routes as it
	// learns them).
	var saveErr error
	for i := 0; ; i++ {
		ep := eps[i%len(eps)]
		if _, saveErr = snapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{ep}, Username: "root", Password: "rootpw"}, file); saveErr == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal(saveErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	dir := filepath.Join(t.TempDir(), "restored")
	if _, err := server.Restore(server.RestoreConfig{SnapshotPath: file, DataDir: dir}); err != nil {
		t.Fatal(err)
	}
	r := testutil.StartBrain(t, server.Config{DataDir: dir, BcryptCost: 4})
	checkAuthState(t, ctx, testutil.Endpoint(r))
}

// TestJWTTokens: with --auth-token jwt, tokens are signed JWTs that every
// node verifies on its own (no shared token state): one from node 1 is
// accepted by node 3, and one signed with another key is refused.
func TestJWTTokens(t *testing.T) {
	dir := t.TempDir()
	keyFiles := func(name string) (pub, priv string) {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		pubDER, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		pub = writeFile(t, dir, name+".pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))
		priv = writeFile(t, dir, name+".key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}))
		return pub, priv
	}
	pub, priv := keyFiles("jwt")
	c := testutil.StartCluster(t, 3, server.Config{BcryptCost: 4, AuthToken: fmt.Sprintf("jwt,pub-key=%s,priv-key=%s,sign-method=RS256,ttl=1m", pub, priv)})
	var eps []string
	for i := range c.Nodes {
		eps = append(eps, testutil.Endpoint(c.Nodes[i]))
	}
	waitAllServing(t, eps)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	setUpAuth(t, ctx, testutil.Client(t, eps[0]))
	for _, ep := range eps {
		checkAuthState(t, ctx, ep)
	}
	ar, err := pb.NewAuthClient(testutil.Dial(t, eps[0])).Authenticate(ctx, &pb.AuthenticateRequest{Name: "alice", Password: "alicepw"})
	if err != nil {
		t.Fatal(err)
	}
	if parts := strings.Split(ar.Token, "."); len(parts) != 3 {
		t.Fatalf("token %q is no JWT", ar.Token)
	}
	kv := pb.NewKVClient(testutil.Dial(t, eps[2]))
	if r, err := kv.Range(metadata.AppendToOutgoingContext(ctx, "token", ar.Token), &pb.RangeRequest{Key: []byte("/a/1")}); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("node 3 with node 1's JWT: %v %v", r, err)
	}
	// A node given keys that do not match refuses to start, with etcd's
	// reason.
	_, otherPriv := keyFiles("other")
	_, err = server.New(server.Config{DataDir: t.TempDir(), ListenClientURLs: []string{"http://127.0.0.1:0"}, ListenPeerURLs: []string{"http://127.0.0.1:0"},
		Logger: testutil.Quiet(), AuthToken: fmt.Sprintf("jwt,pub-key=%s,priv-key=%s,sign-method=RS256", pub, otherPriv)})
	if err == nil || !strings.Contains(err.Error(), "keys don't match") {
		t.Fatalf("a node with mismatched JWT keys: %v", err)
	}
	// A token whose signature is not the key's.
	forged := strings.Split(ar.Token, ".")
	forged[2] = strings.Repeat("A", len(forged[2]))
	if _, err := kv.Range(metadata.AppendToOutgoingContext(ctx, "token", strings.Join(forged, ".")), &pb.RangeRequest{Key: []byte("/a/1")}); err == nil || !strings.Contains(err.Error(), "invalid auth token") {
		t.Fatalf("a forged JWT: %v, want invalid auth token", err)
	}
}

// TestEtcdctlAuthCommands runs etcdctl's user, role and auth commands
// (etcdctl 3.6, `go tool etcdctl`) against etcd and brain and requires the
// same output from each.
func TestEtcdctlAuthCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds etcdctl")
	}
	bin := filepath.Join(t.TempDir(), "etcdctl")
	if out, err := exec.Command("go", "build", "-o", bin, "go.etcd.io/etcd/etcdctl/v3").CombinedOutput(); err != nil {
		t.Fatalf("build etcdctl: %v\n%s", err, out)
	}
	script := [][]string{
		{"user", "add", "root:rootpw"},
		{"user", "grant-role", "root", "root"},
		{"role", "add", "r"},
		{"role", "grant-permission", "r", "--prefix=true", "readwrite", "/a/"},
		{"role", "grant-permission", "r", "read", "/c/x"},
		{"role", "grant-permission", "r", "write", "/d/b", "/d/d"},
		{"user", "add", "alice:alicepw"},
		{"user", "grant-role", "alice", "r"},
		{"user", "add", "nopw", "--no-password"},
		{"auth", "enable"},
		{"put", "/a/x", "1"},
		{"--user", "alice:alicepw", "put", "/a/x", "1"},
		{"--user", "alice:alicepw", "get", "/a/x"},
		{"--user", "alice:alicepw", "put", "/b/x", "1"},
		{"--user", "alice:wrong", "get", "/a/x"},
		{"--user", "root:rootpw", "user", "list"},
		{"--user", "root:rootpw", "user", "get", "alice"},
		{"--user", "root:rootpw", "role", "list"},
		{"--user", "root:rootpw", "role", "get", "r"},
		{"--user", "root:rootpw", "auth", "status"},
		{"--user", "alice:alicepw", "auth", "status"},
		{"--user", "root:rootpw", "role", "revoke-permission", "r", "/c/x"},
		{"--user", "root:rootpw", "user", "revoke-role", "alice", "r"},
		{"--user", "alice:alicepw", "get", "/a/x"},
		{"--user", "root:rootpw", "user", "passwd", "alice", "--interactive=false"},
		{"--user", "root:rootpw", "user", "delete", "alice"},
		{"--user", "root:rootpw", "role", "delete", "r"},
		{"--user", "root:rootpw", "auth", "disable"},
		{"get", "/a/x"},
	}
	run := func(ep string) []string {
		var out []string
		for _, args := range script {
			cmd := exec.Command(bin, append([]string{"--endpoints", ep, "--dial-timeout", "5s", "--command-timeout", "10s"}, args...)...)
			if args[len(args)-1] == "--interactive=false" {
				cmd.Stdin = strings.NewReader("newpw\n")
			}
			b, err := cmd.CombinedOutput()
			line := fmt.Sprintf("%v: %s", args, strings.TrimSpace(string(b)))
			if err != nil {
				line += " (failed)"
			}
			// Error lines carry a timestamp and etcdctl's "{...}" log
			// context; keep the message.
			if i := strings.Index(line, "Error: "); i >= 0 {
				line = line[:strings.Index(line, ": ")+2] + line[i:]
			}
			out = append(out, line)
		}
		return out
	}
	want := run(testutil.StartEtcd(t))
	s := testutil.StartBrain(t, server.Config{BcryptCost: 4})
	got := run(testutil.Endpoint(s))
	for i := range want {
		if want[i] != got[i] {
			t.Errorf("etcdctl %v:\n etcd:  %s\n brain: %s", script[i], want[i], got[i])
		}
	}
}
