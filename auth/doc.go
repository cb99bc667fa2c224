// Package auth is etcd's authentication and role-based access control on
// brain: users, roles with key-range permissions, auth enable/disable,
// simple and JWT tokens, the user of a client certificate's common name,
// and the permission checks of every request, with etcd's errors.
//
// The rules are etcd's own: a Store wraps go.etcd.io/etcd/server/v3/auth's
// store, so users, roles, permission ranges, password hashing and tokens
// behave exactly as in etcd. What brain supplies is where the state lives
// and how it is replicated:
//
//   - The state (users, roles, the enabled flag and the auth revision)
//     lives in the meta raft group's key range of each node's store
//     (backend.go), so it survives restarts, travels in the meta group's
//     snapshots and is the same on every node.
//   - Every change is an etcd InternalRaftRequest proposed to the meta
//     group (meta's cmdAuth) and applied on every replica by Apply, with
//     etcd's admin check on the request's header (the user and auth
//     revision of the caller), as etcd's authApplierV3 does.
//   - Authenticate is proposed too (etcd does the same): a simple token
//     names the meta group's log index it was assigned at, and a node
//     accepts it once its replica has applied that index.
//
// Passwords are hashed (bcrypt) on the node that takes the request, before
// it is proposed: no clear password enters the log.
package auth
